package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/yaml"

	etcdv1alpha1 "github.com/sharder-dev/sharder/examples/etcd-operator/api/v1alpha1"
	"github.com/sharder-dev/sharder/examples/etcd-operator/internal/controller"
	"github.com/sharder-dev/sharder/internal/reconcilelog"
	"github.com/sharder-dev/sharder/internal/testenv"
	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

var suite testenv.Suite // the control plane, started for the first test that calls env

func env() *testenv.Env { return suite.Env() }

func TestMain(m *testing.M) {
	scheme := testenv.DefaultScheme()
	utilruntime.Must(etcdv1alpha1.AddToScheme(scheme))
	os.Exit(testenv.Run(m, &suite, testenv.Options{
		CRDDirectoryPaths: []string{"examples/etcd-operator/config/crd"},
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
				o.metricsBindAddress != ":8080" || o.healthProbeBindAddress != ":8081" || o.reconcileLog != "" {
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
			"--etcd-timeout=3s", "--etcd-check-interval=7s", "--progress-interval=3s", "--zap-log-level=debug"},
			getenv: noEnv, check: func(t *testing.T, o *options) {
				if o.kubeconfig != "/k" || o.ring != "r" || o.leaseNamespace != "ns" || o.instance != "i" ||
					o.leaseDuration != 20*time.Second || o.renewPeriod != 4*time.Second || o.virtualNodes != 64 ||
					o.metricsBindAddress != "0" || o.healthProbeBindAddress != ":9" || o.maxConcurrentReconciles != 2 ||
					o.recoveryInterval != 5*time.Second || o.etcdTimeout != 3*time.Second || o.etcdCheckInterval != 7*time.Second || o.progressInterval != 3*time.Second {
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
