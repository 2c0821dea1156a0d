package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/yaml"

	etcdv1alpha1 "github.com/sharder-dev/sharder/examples/etcd-operator/api/v1alpha1"
	"github.com/sharder-dev/sharder/examples/etcd-operator/internal/controller"
	"github.com/sharder-dev/sharder/internal/reconcilelog"
	"github.com/sharder-dev/sharder/internal/testenv"
	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/instance"
	"github.com/sharder-dev/sharder/pkg/slots"
)

var suite testenv.Suite // the control plane, started for the first test that calls env

func env() *testenv.Env { return suite.Env() }

func TestMain(m *testing.M) {
	scheme := testenv.DefaultScheme()
	utilruntime.Must(etcdv1alpha1.AddToScheme(scheme))
	utilruntime.Must(sharderv1alpha1.AddToScheme(scheme))
	os.Exit(testenv.Run(m, &suite, testenv.Options{
		CRDDirectoryPaths: []string{"examples/etcd-operator/config/crd", "config/crd/bases"},
		Scheme:            scheme,
	}))
}

func TestParseFlags(t *testing.T) {
	noEnv := func(string) string { return "" }
	tests := []struct {
		name    string
		args    []string
		getenv  func(string) string
		check   func(*testing.T, *options)
		wantErr string
	}{
		{name: "defaults", args: []string{"--instance=op-0"}, getenv: noEnv, check: func(t *testing.T, o *options) {
			if o.ring != "etcd-operator" || o.leaseNamespace != "etcd-operator-system" || o.leaseDuration != 15*time.Second ||
				o.metricsBindAddress != ":8080" || o.healthProbeBindAddress != ":8081" || o.reconcileLog != "" || o.shardedListAndWatch {
				t.Errorf("defaults: %+v", o)
			}
		}},
		{name: "reconcile log from the environment", args: []string{"--instance=op-0"},
			getenv: func(k string) string {
				if k == reconcileLogEnv {
					return "/tmp/log.jsonl"
				}
				return ""
			},
			check: func(t *testing.T, o *options) {
				if o.reconcileLog != "/tmp/log.jsonl" {
					t.Errorf("reconcile log = %q", o.reconcileLog)
				}
			}},
		{name: "flag wins over environment", args: []string{"--instance=op-0", "--reconcile-log=/a"},
			getenv: func(string) string { return "/b" },
			check: func(t *testing.T, o *options) {
				if o.reconcileLog != "/a" {
					t.Errorf("reconcile log = %q", o.reconcileLog)
				}
			}},
		{name: "all flags", args: []string{"--kubeconfig=/k", "--ring=r", "--lease-namespace=ns", "--instance=i",
			"--lease-duration=20s", "--renew-period=4s", "--virtual-nodes=64", "--metrics-bind-address=0",
			"--health-probe-bind-address=:9", "--max-concurrent-reconciles=2", "--recovery-interval=5s",
			"--etcd-timeout=3s", "--etcd-check-interval=7s", "--progress-interval=3s", "--sharded-list-and-watch", "--zap-log-level=debug"},
			getenv: noEnv, check: func(t *testing.T, o *options) {
				if o.kubeconfig != "/k" || o.ring != "r" || o.leaseNamespace != "ns" || o.instance != "i" ||
					o.leaseDuration != 20*time.Second || o.renewPeriod != 4*time.Second || o.virtualNodes != 64 ||
					o.metricsBindAddress != "0" || o.healthProbeBindAddress != ":9" || o.maxConcurrentReconciles != 2 ||
					o.recoveryInterval != 5*time.Second || o.etcdTimeout != 3*time.Second || o.etcdCheckInterval != 7*time.Second || o.progressInterval != 3*time.Second ||
					!o.shardedListAndWatch {
					t.Errorf("parsed: %+v", o)
				}
			}},
		{name: "bad etcd timeout", args: []string{"--instance=i", "--etcd-timeout=0s"}, getenv: noEnv, wantErr: "--etcd-timeout must be positive"},
		{name: "bad progress interval", args: []string{"--instance=i", "--progress-interval=0s"}, getenv: noEnv, wantErr: "--progress-interval must be positive"},
		{name: "empty ring", args: []string{"--instance=i", "--ring="}, getenv: noEnv, wantErr: "--ring must not be empty"},
		{name: "bad concurrency", args: []string{"--instance=i", "--max-concurrent-reconciles=0"}, getenv: noEnv, wantErr: "at least 1"},
		{name: "unknown flag", args: []string{"--nope"}, getenv: noEnv, wantErr: "unknown flag"},
		{name: "stray argument", args: []string{"--instance=i", "extra"}, getenv: noEnv, wantErr: "unexpected arguments"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := parseFlags(tt.args, tt.getenv)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v; want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, o)
		})
	}
}

func TestOwnerPod(t *testing.T) {
	vars := map[string]string{"POD_NAME": "etcd-operator-0", "POD_UID": "u-1"}
	ref := ownerPod(func(k string) string { return vars[k] })
	if ref == nil || ref.Kind != "Pod" || ref.Name != "etcd-operator-0" || ref.UID != "u-1" {
		t.Errorf("owner = %+v", ref)
	}
	if ownerPod(func(string) string { return "" }) != nil {
		t.Error("owner without the downward API variables")
	}
}

// TestRun runs the operator's main loop as an instance: it holds its Lease,
// reconciles only the clusters labelled for it, labels their children for
// itself, writes the reconcile log and releases its Lease on shutdown.
func TestRun(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := env().Namespace(t)
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	g.Expect(env().WriteKubeConfig(kubeconfig)).To(Succeed())
	logPath := filepath.Join(dir, "reconcile.jsonl")
	o, err := parseFlags([]string{"--kubeconfig=" + kubeconfig, "--ring=etcd", "--lease-namespace=" + ns, "--instance=op-0",
		"--metrics-bind-address=0", "--health-probe-bind-address=0", "--reconcile-log=" + logPath, "--lease-duration=5s"},
		func(string) string { return "" })
	g.Expect(err).NotTo(HaveOccurred())

	o.repeatedRun = true // go test -count=N runs this test N times in one process
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- run(runCtx, o) }()

	lease := &coordinationv1.Lease{}
	g.Eventually(func(g Gomega) {
		select {
		case err := <-done: // an operator that stopped never holds its Lease: say why at once
			StopTrying(fmt.Sprintf("the operator stopped before holding its Lease: run returned %v", err)).Now()
		default:
		}
		g.Expect(env().Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "op-0"}, lease)).To(Succeed())
		g.Expect(lease.Labels).To(HaveKeyWithValue(sharderv1alpha1.LabelRing, "etcd"))
		g.Expect(lease.Spec.HolderIdentity).To(HaveValue(Equal("op-0")))
	}, 30*time.Second, 100*time.Millisecond).Should(Succeed())

	shard := sharderv1alpha1.ShardLabel("etcd")
	mine := &etcdv1alpha1.EtcdCluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "mine", Labels: map[string]string{shard: "op-0"}}}
	theirs := &etcdv1alpha1.EtcdCluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "theirs", Labels: map[string]string{shard: "op-1"}}}
	g.Expect(env().Client.Create(ctx, mine)).To(Succeed())
	g.Expect(env().Client.Create(ctx, theirs)).To(Succeed())

	g.Eventually(func(g Gomega) {
		got := &etcdv1alpha1.EtcdCluster{}
		g.Expect(env().Client.Get(ctx, client.ObjectKeyFromObject(mine), got)).To(Succeed())
		g.Expect(got.Finalizers).To(ContainElement(controller.Finalizer))
		g.Expect(got.Status.Phase).To(Equal(etcdv1alpha1.EtcdClusterPhaseCreating))
		cm := &corev1.ConfigMap{}
		g.Expect(env().Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "mine-config"}, cm)).To(Succeed())
		g.Expect(cm.Labels).To(HaveKeyWithValue(shard, "op-0"))
		svc := &corev1.Service{}
		g.Expect(env().Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "mine-client"}, svc)).To(Succeed())
		g.Expect(svc.Labels).To(HaveKeyWithValue(shard, "op-0"))
	}, 30*time.Second, 100*time.Millisecond).Should(Succeed())
	g.Consistently(func(g Gomega) []string {
		got := &etcdv1alpha1.EtcdCluster{}
		g.Expect(env().Client.Get(ctx, client.ObjectKeyFromObject(theirs), got)).To(Succeed())
		return got.Finalizers
	}, time.Second, 100*time.Millisecond).Should(BeEmpty(), "a cluster of another instance was reconciled")

	cancel()
	g.Eventually(done, 45*time.Second).Should(Receive(BeNil()))
	g.Expect(env().Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "op-0"}, lease)).To(Succeed())
	g.Expect(lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "").To(BeTrue(), "the Lease was not released")

	f, err := os.Open(logPath)
	g.Expect(err).NotTo(HaveOccurred())
	defer f.Close()
	phases := map[string][]string{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		var rec reconcilelog.Record
		g.Expect(json.Unmarshal(s.Bytes(), &rec)).To(Succeed())
		g.Expect(rec.Instance).To(Equal("op-0"))
		phases[rec.Name] = append(phases[rec.Name], rec.Phase)
		if rec.Phase == reconcilelog.PhaseEnd {
			g.Expect(rec.Generation).To(BeEquivalentTo(1))
		}
	}
	g.Expect(phases).NotTo(HaveKey("theirs"))
	g.Expect(phases["mine"]).NotTo(BeEmpty())
	for i, p := range phases["mine"] {
		want := reconcilelog.PhaseStart
		if i%2 == 1 {
			want = reconcilelog.PhaseEnd
		}
		g.Expect(p).To(Equal(want), "records of one object alternate start and end")
	}
}

// TestRingCoversCache: the example's ring (config/ring) assigns every
// resource the instance caches with the shard label selector; a resource it
// left out would never carry the label, and the instance would never see it.
func TestRingCoversCache(t *testing.T) {
	g := NewWithT(t)
	data, err := os.ReadFile(filepath.Join("..", "..", "config", "ring", "controllerring.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	var ring sharderv1alpha1.ControllerRing
	g.Expect(yaml.UnmarshalStrict(data, &ring)).To(Succeed())
	inRing := map[schema.GroupResource]bool{}
	for _, r := range ring.Spec.Resources {
		inRing[schema.GroupResource{Group: r.Group, Resource: r.Resource}] = true
		for _, c := range r.ControlledResources {
			inRing[schema.GroupResource{Group: c.Group, Resource: c.Resource}] = true
		}
	}
	for _, obj := range cachedObjects() {
		gvk, err := apiutil.GVKForObject(obj, newScheme())
		g.Expect(err).NotTo(HaveOccurred())
		mapping, err := env().Client.RESTMapper().RESTMapping(gvk.GroupKind(), gvk.Version)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(inRing).To(HaveKey(mapping.Resource.GroupResource()), "the ring does not assign %s", gvk.Kind)
	}
}

// TestRunShardedListAndWatch: with --sharded-list-and-watch on a slot ring
// keyed by namespace, the operator reconciles an EtcdCluster of a slot it
// holds before the sharder labelled it (no sharder runs here: the cluster
// never gets a slot label), gives its children the slot of its namespace,
// and leaves alone a cluster of a slot it does not hold. The API server
// here has no ShardedListAndWatch gate: it ignores the shard selector, and
// the operator checks each object's slot itself. On a ring keyed by object,
// and on a ring it cannot find, it refuses to start, saying why.
func TestRunShardedListAndWatch(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	const count = 8
	ns := env().Namespace(t)
	other := env().Namespace(t)
	for slots.ForNamespace(other, count) == slots.ForNamespace(ns, count) {
		other = env().Namespace(t)
	}
	mySlot := slots.ForNamespace(ns, count)
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	g.Expect(env().WriteKubeConfig(kubeconfig)).To(Succeed())
	createRing := func(g Gomega, name, key string) {
		ring := &sharderv1alpha1.ControllerRing{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: sharderv1alpha1.ControllerRingSpec{
				LeaseNamespace: ns,
				Resources:      []sharderv1alpha1.RingResource{{Group: etcdv1alpha1.GroupVersion.Group, Resource: "etcdclusters"}},
				Assignment: &sharderv1alpha1.RingAssignment{Unit: sharderv1alpha1.AssignmentUnitSlots,
					Slots: &sharderv1alpha1.RingSlots{Count: count, Key: key}},
			},
		}
		g.Expect(env().Client.Create(ctx, ring)).To(Succeed())
		t.Cleanup(func() { _ = env().Client.Delete(ctx, ring) })
		table := slots.NewTable(count)
		table.Revision = 1
		for slot := range count {
			table.Slots[slot] = slots.Slot{Holder: "op-1"}
		}
		table.Slots[mySlot] = slots.Slot{Holder: "op-0"}
		g.Eventually(func() error {
			if err := env().Client.Get(ctx, client.ObjectKeyFromObject(ring), ring); err != nil {
				return err
			}
			ring.Status.Slots = table.Status()
			return env().Client.Status().Update(ctx, ring)
		}).Should(Succeed())
	}
	options := func(g Gomega, ring string) *options {
		o, err := parseFlags([]string{"--kubeconfig=" + kubeconfig, "--ring=" + ring, "--lease-namespace=" + ns, "--instance=op-0",
			"--metrics-bind-address=0", "--health-probe-bind-address=0", "--lease-duration=5s", "--sharded-list-and-watch"},
			func(string) string { return "" })
		g.Expect(err).NotTo(HaveOccurred())
		o.repeatedRun = true
		return o
	}

	t.Run("ring keyed by namespace", func(t *testing.T) {
		g := NewWithT(t)
		ring := ns + "-by-namespace"
		createRing(g, ring, sharderv1alpha1.SlotKeyNamespace)
		runCtx, cancel := context.WithCancel(ctx)
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- run(runCtx, options(g, ring)) }()

		mine := &etcdv1alpha1.EtcdCluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "mine"}}
		theirs := &etcdv1alpha1.EtcdCluster{ObjectMeta: metav1.ObjectMeta{Namespace: other, Name: "theirs"}}
		g.Expect(env().Client.Create(ctx, mine)).To(Succeed())
		g.Expect(env().Client.Create(ctx, theirs)).To(Succeed())
		slotLabel := sharderv1alpha1.SlotLabel(ring)
		g.Eventually(func(g Gomega) {
			select {
			case err := <-done:
				StopTrying(fmt.Sprintf("the operator stopped: run returned %v", err)).Now()
			default:
			}
			got := &etcdv1alpha1.EtcdCluster{}
			g.Expect(env().Client.Get(ctx, client.ObjectKeyFromObject(mine), got)).To(Succeed())
			g.Expect(got.Labels).NotTo(HaveKey(slotLabel), "no sharder runs here")
			g.Expect(got.Finalizers).To(ContainElement(controller.Finalizer))
			cm := &corev1.ConfigMap{}
			g.Expect(env().Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "mine-config"}, cm)).To(Succeed())
			g.Expect(cm.Labels).To(HaveKeyWithValue(slotLabel, strconv.Itoa(mySlot)))
		}, 30*time.Second, 100*time.Millisecond).Should(Succeed())
		g.Consistently(func(g Gomega) []string {
			got := &etcdv1alpha1.EtcdCluster{}
			g.Expect(env().Client.Get(ctx, client.ObjectKeyFromObject(theirs), got)).To(Succeed())
			return got.Finalizers
		}, time.Second, 100*time.Millisecond).Should(BeEmpty(), "a cluster of a slot the operator does not hold was reconciled")
		cancel()
		g.Eventually(done, 45*time.Second).Should(Receive(BeNil()))
		for _, c := range []*etcdv1alpha1.EtcdCluster{mine, theirs} {
			g.Expect(client.IgnoreNotFound(env().Client.Patch(ctx, c, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`))))).To(Succeed())
		}
	})
	t.Run("ring keyed by object", func(t *testing.T) {
		g := NewWithT(t)
		ring := ns + "-by-object"
		createRing(g, ring, sharderv1alpha1.SlotKeyObject)
		runCtx, cancel := context.WithTimeout(ctx, time.Minute) // an operator that starts fails the test, not hangs it
		defer cancel()
		err := run(runCtx, options(g, ring))
		g.Expect(err).To(MatchError(instance.ErrShardedListAndWatch))
		g.Expect(err.Error()).To(ContainSubstring("spec.assignment.slots.key: Namespace"))
	})
	t.Run("no ring", func(t *testing.T) {
		g := NewWithT(t)
		runCtx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		err := run(runCtx, options(g, ns+"-missing"))
		g.Expect(err).To(MatchError(ContainSubstring("--sharded-list-and-watch needs a ring of unit Slots")))
	})
}
