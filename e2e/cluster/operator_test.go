package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	etcdv1alpha1 "github.com/sharder-dev/sharder/examples/etcd-operator/api/v1alpha1"

	"github.com/sharder-dev/sharder/internal/localrun"
	"github.com/sharder-dev/sharder/internal/testenv"
	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// The example operator as its kustomization installs it.
const (
	operatorRing      = "etcd-operator"
	operatorNamespace = "etcd-operator-system"
	operatorName      = "etcd-operator"
	clustersNamespace = "etcd-e2e"
	// clusters is how many EtcdClusters the scenario spreads.
	clusters = 12
	// operatorLeaseSeconds is the operator instances' lease duration (the
	// kustomization's is 15 s).
	operatorLeaseSeconds = 5
)

var (
	etcdClusterKind = schema.GroupKind{Group: etcdv1alpha1.GroupVersion.Group, Kind: "EtcdCluster"}
	etcdClusterGVR  = etcdv1alpha1.GroupVersion.WithResource("etcdclusters")
)

// testEtcdOperator: the example operator, installed from its kustomization
// as a StatefulSet of 3 instances, gets the EtcdClusters spread over its
// pods; scaled to 4, the new pod takes its share, every object that moves is
// drained from its old instance first, and no EtcdCluster is ever reconciled
// by two pods at once.
func testEtcdOperator(t *testing.T) {
	g := NewWithT(t)
	ctx := t.Context()

	By(t, "the operator's kustomization, with each pod's reconcile log on the node")
	logs := reconcileLogDir(t)
	installOperator(ctx, t, g, logs)
	waitReadyReplicas(ctx, g, 3)

	tracker, err := localrun.NewTracker(restConfig, etcdClusterGVR, clustersNamespace, operatorRing)
	g.Expect(err).NotTo(HaveOccurred())
	drained := newDrainRecorder(ctx, t)
	g.Expect(tracker.Start(ctx)).To(Succeed())

	By(t, fmt.Sprintf("%d EtcdClusters spread over 3 instances", clusters))
	g.Expect(k8sClient.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: clustersNamespace}})).To(Succeed())
	for i := range clusters {
		g.Expect(k8sClient.Create(ctx, &etcdv1alpha1.EtcdCluster{
			ObjectMeta: metav1.ObjectMeta{Namespace: clustersNamespace, Name: fmt.Sprintf("etcd-%02d", i)},
			Spec:       etcdv1alpha1.EtcdClusterSpec{Size: 1},
		})).To(Succeed())
	}
	before := waitSettled(ctx, t, tracker, instances(3))
	expectReconciledByOwner(g, logs, before)

	By(t, "scaled to 4, the new instance takes its share through drains")
	var sts appsv1.StatefulSet
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: operatorNamespace, Name: operatorName}, &sts)).To(Succeed())
	patch := client.MergeFrom(sts.DeepCopy())
	sts.Spec.Replicas = ptr.To[int32](4)
	g.Expect(k8sClient.Patch(ctx, &sts, patch)).To(Succeed())
	waitReadyReplicas(ctx, g, 4)
	after := waitSettled(ctx, t, tracker, instances(4))

	added := instances(4)[3]
	prev := before.ByKey()
	var moved []string
	for _, o := range after {
		if prev[o.Key] != o.Instance {
			moved = append(moved, o.Key)
			g.Expect(o.Instance).To(Equal(added), "%s moved from %s to %s, not to the new instance", o.Key, prev[o.Key], o.Instance)
		}
	}
	g.Expect(moved).NotTo(BeEmpty(), "the new instance got no EtcdClusters")
	t.Logf("%d of %d EtcdClusters moved to %s; before:\n%safter:\n%s", len(moved), clusters, added,
		localrun.FormatCounts(before.Counts()), localrun.FormatCounts(after.Counts()))
	for _, key := range moved {
		g.Expect(drained.seen(key)).To(BeTrue(), "%s moved without its old instance being asked to drain it", key)
	}
	expectReconciledByOwner(g, logs, after)
	expectNoOverlap(g, logs)

	// Each disruption ends with the 4 instances ready, every EtcdCluster
	// on the instance the ring of the 4 chooses (none left on a gone
	// process), last reconciled there, and none ever reconciled by two
	// processes at once.
	for _, s := range []struct {
		name string
		fn   func(t *testing.T, g Gomega)
	}{
		{"rolling update of the StatefulSet", rollOperator},
		{"force-deleted instance pod", forceDeleteInstance},
		{"sharder leader pod deleted", deleteSharderLeader},
	} {
		if !t.Run(s.name, func(t *testing.T) {
			g := NewWithT(t)
			s.fn(t, g)
			waitReadyReplicas(ctx, g, 4)
			waitRingReady(ctx, g, instances(4))
			settled := waitSettled(ctx, t, tracker, instances(4))
			expectReconciledByOwner(g, logs, settled)
			expectNoOverlap(g, logs)
			t.Logf("EtcdClusters:\n%s", localrun.FormatCounts(settled.Counts()))
		}) {
			return
		}
	}
}

// rollOperator changes the operator's pod template and waits until every
// pod has been replaced, one by one, under its own name: each instance
// releases its Lease on the way out, the sharder moves its objects away and
// holds the Lease meanwhile, and the restarted instance takes it back.
func rollOperator(t *testing.T, g Gomega) {
	ctx := t.Context()
	old := operatorPodUIDs(ctx, g)
	g.Expect(old).To(HaveLen(4))
	var sts appsv1.StatefulSet
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: operatorNamespace, Name: operatorName}, &sts)).To(Succeed())
	patch := client.MergeFrom(sts.DeepCopy())
	if sts.Spec.Template.Annotations == nil {
		sts.Spec.Template.Annotations = map[string]string{}
	}
	sts.Spec.Template.Annotations["e2e.sharder.dev/rollout"] = time.Now().UTC().Format(time.RFC3339Nano)
	g.Expect(k8sClient.Patch(ctx, &sts, patch)).To(Succeed())
	g.Eventually(func(g Gomega) {
		var sts appsv1.StatefulSet
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: operatorNamespace, Name: operatorName}, &sts)).To(Succeed())
		g.Expect(sts.Status.ObservedGeneration).To(Equal(sts.Generation))
		g.Expect(sts.Status.UpdatedReplicas).To(Equal(int32(4)))
		g.Expect(sts.Status.CurrentRevision).To(Equal(sts.Status.UpdateRevision))
		g.Expect(sts.Status.ReadyReplicas).To(Equal(int32(4)))
		now := operatorPodUIDs(ctx, g)
		g.Expect(now).To(HaveLen(4))
		for name, uid := range now {
			g.Expect(uid).NotTo(Equal(old[name]), "%s not replaced yet", name)
		}
	}).WithTimeout(4 * time.Minute).WithPolling(time.Second).Should(Succeed())
}

// forceDeleteInstance deletes an instance's pod with no grace: the garbage
// collector deletes its Lease, the sharder holds the vanished instance's
// objects until two lease durations after its last renewal, and the
// StatefulSet's new pod of the same name creates a new Lease of its own.
func forceDeleteInstance(t *testing.T, g Gomega) {
	ctx := t.Context()
	victim := instances(4)[1]
	var pod corev1.Pod
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: operatorNamespace, Name: victim}, &pod)).To(Succeed())
	var lease coordinationv1.Lease
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: operatorNamespace, Name: victim}, &lease)).To(Succeed())
	g.Expect(lease.OwnerReferences).To(ContainElement(HaveField("UID", pod.UID)), "the Lease belongs to its pod")
	if _, err := kubectl(ctx, "delete", "pod", "--namespace", operatorNamespace, victim, "--force", "--grace-period=0"); err != nil {
		t.Fatal(err)
	}
	g.Eventually(func(g Gomega) {
		var now corev1.Pod
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: operatorNamespace, Name: victim}, &now)).To(Succeed())
		g.Expect(now.UID).NotTo(Equal(pod.UID), "the StatefulSet recreates the pod")
		var l coordinationv1.Lease
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: operatorNamespace, Name: victim}, &l)).To(Succeed())
		g.Expect(l.UID).NotTo(Equal(lease.UID), "the old Lease is collected")
		g.Expect(l.OwnerReferences).To(ContainElement(HaveField("UID", now.UID)), "the new Lease belongs to the new pod")
	}).WithTimeout(3 * time.Minute).WithPolling(time.Second).Should(Succeed())
}

// deleteSharderLeader deletes the pod of the sharder's leader: the other
// replica takes over.
func deleteSharderLeader(t *testing.T, g Gomega) {
	ctx := t.Context()
	leader := sharderLeaderPod(ctx, g)
	g.Expect(k8sClient.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: sharderNamespace, Name: leader}})).To(Succeed())
	g.Eventually(func(g Gomega) {
		now := sharderLeaderPod(ctx, g)
		g.Expect(now).NotTo(Equal(leader))
	}).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
	t.Logf("leader %s deleted; %s leads", leader, sharderLeaderPod(ctx, g))
}

// sharderLeaderPod returns the name of the sharder pod that holds the
// leader-election Lease (identity <pod name>_<random>).
func sharderLeaderPod(ctx context.Context, g Gomega) string {
	var lease coordinationv1.Lease
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: sharderNamespace, Name: release}, &lease)).To(Succeed())
	holder := ptr.Deref(lease.Spec.HolderIdentity, "")
	pod, _, ok := strings.Cut(holder, "_")
	g.Expect(ok).To(BeTrue(), "leader identity %q", holder)
	return pod
}

// operatorPodUIDs returns the UID of each operator pod by name.
func operatorPodUIDs(ctx context.Context, g Gomega) map[string]types.UID {
	var pods corev1.PodList
	g.Expect(k8sClient.List(ctx, &pods, client.InNamespace(operatorNamespace), client.MatchingLabels{"app.kubernetes.io/name": operatorName})).To(Succeed())
	uids := map[string]types.UID{}
	for _, p := range pods.Items {
		uids[p.Name] = p.UID
	}
	return uids
}

// waitRingReady waits until the ring's members are exactly ids, each ready.
func waitRingReady(ctx context.Context, g Gomega, ids []string) {
	g.Eventually(func(g Gomega) {
		var r sharderv1alpha1.ControllerRing
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Name: operatorRing}, &r)).To(Succeed())
		want := make([]any, len(ids))
		for i, id := range ids {
			want[i] = And(HaveField("Name", id), HaveField("State", "ready"))
		}
		g.Expect(r.Status.Members).To(ConsistOf(want...))
		g.Expect(r.Status.AvailableInstances).To(Equal(int32(len(ids))))
	}).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
}

// expectNoOverlap checks that no EtcdCluster was ever reconciled by two
// processes at once: two instances, or two pods of one instance (a pod and
// its replacement under the same name), each pod writing a log of its own.
// A reconcile a killed process left without an end lasts until now.
func expectNoOverlap(g Gomega, logs string) {
	files, err := filepath.Glob(filepath.Join(logs, "*.jsonl"))
	g.Expect(err).NotTo(HaveOccurred())
	var all []localrun.ReconcileRecord
	for _, f := range files {
		recs, err := localrun.ReadReconcileLog(f)
		g.Expect(err).NotTo(HaveOccurred())
		pod := strings.TrimSuffix(filepath.Base(f), ".jsonl")
		for i := range recs {
			recs[i].Instance = pod
		}
		all = append(all, recs...)
	}
	overlaps := localrun.Overlaps(localrun.Intervals(all, nil, time.Now()))
	msgs := make([]string, 0, len(overlaps))
	for _, o := range overlaps {
		msgs = append(msgs, o.String())
	}
	g.Expect(msgs).To(BeEmpty(), "EtcdClusters reconciled by two processes at once")
}

// instances returns the instance IDs of a StatefulSet of n pods.
func instances(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%d", operatorName, i)
	}
	return ids
}

// reconcileLogDir returns a folder on the node (this machine) that the
// operator's pods, running as a non-root user, can write their reconcile
// logs into.
func reconcileLogDir(t *testing.T) string {
	dir, err := os.MkdirTemp("", "sharder-e2e-reconcile-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// installOperator applies examples/etcd-operator/config with one change:
// each pod appends its reconcile log to logs/<pod name>.jsonl, a hostPath.
func installOperator(ctx context.Context, t *testing.T, g Gomega, logs string) {
	out, err := kubectl(ctx, "kustomize", filepath.Join(repoRoot, "examples", "etcd-operator", "config"))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := testenv.DecodeObjects([]byte(out))
	g.Expect(err).NotTo(HaveOccurred())
	var docs []string
	for _, o := range objs {
		if o.GetKind() == "StatefulSet" && o.GetName() == operatorName {
			var sts appsv1.StatefulSet
			g.Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &sts)).To(Succeed())
			pod := &sts.Spec.Template.Spec
			g.Expect(*sts.Spec.Replicas).To(Equal(int32(3)), "the kustomization runs 3 instances")
			pod.Volumes = append(pod.Volumes, corev1.Volume{Name: "reconcile-log", VolumeSource: corev1.VolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: logs, Type: ptr.To(corev1.HostPathDirectory)},
			}})
			c := &pod.Containers[0]
			c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "reconcile-log", MountPath: "/reconcile"})
			// One log per process: a pod that restarts under the same name
			// (the same instance ID) is a new pod with a new UID.
			c.Args = append(c.Args, "--reconcile-log=/reconcile/$(POD_NAME)_$(POD_UID).jsonl")
			// Short Leases, so that restarts and a vanished instance
			// resolve within seconds.
			i := slices.Index(c.Args, "--lease-duration=15s")
			g.Expect(i).NotTo(Equal(-1), "the StatefulSet sets --lease-duration=15s: %v", c.Args)
			c.Args[i] = fmt.Sprintf("--lease-duration=%ds", operatorLeaseSeconds)
			o.Object, err = runtime.DefaultUnstructuredConverter.ToUnstructured(&sts)
			g.Expect(err).NotTo(HaveOccurred())
		}
		data, err := yaml.Marshal(o.Object)
		g.Expect(err).NotTo(HaveOccurred())
		docs = append(docs, string(data))
	}
	manifests := filepath.Join(t.TempDir(), "operator.yaml")
	g.Expect(os.WriteFile(manifests, []byte(strings.Join(docs, "---\n")), 0o644)).To(Succeed())
	if _, err := kubectl(ctx, "apply", "--server-side", "--field-manager=e2e", "-f", manifests); err != nil {
		t.Fatal(err)
	}
}

// waitReadyReplicas waits for n Ready operator pods: each holds its Lease.
func waitReadyReplicas(ctx context.Context, g Gomega, n int32) {
	g.Eventually(func(g Gomega) {
		var sts appsv1.StatefulSet
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: operatorNamespace, Name: operatorName}, &sts)).To(Succeed())
		g.Expect(sts.Status.ReadyReplicas).To(Equal(n))
	}).WithTimeout(3 * time.Minute).WithPolling(time.Second).Should(Succeed())
}

// waitSettled waits until every EtcdCluster sits on the instance the ring
// of ids chooses, none draining.
func waitSettled(ctx context.Context, t *testing.T, tracker *localrun.Tracker, ids []string) localrun.Assignment {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := tracker.Wait(ctx, localrun.SettledOn(etcdClusterKind, clusters, ids...)); err != nil {
		t.Fatalf("EtcdClusters did not settle on %v: %v\n%s", ids, err, localrun.FormatCounts(tracker.Assignment().Counts()))
	}
	return tracker.Assignment()
}

// expectReconciledByOwner waits until every EtcdCluster has last been
// reconciled, to the end, by the instance it is assigned to.
func expectReconciledByOwner(g Gomega, logs string, a localrun.Assignment) {
	g.Eventually(func(g Gomega) {
		last := localrun.LastReconcile(localrun.Intervals(readReconcileLogs(g, logs), nil, time.Now()))
		for _, o := range a {
			iv, ok := last[o.Key]
			g.Expect(ok).To(BeTrue(), "%s never reconciled", o.Key)
			g.Expect(iv.Instance).To(Equal(o.Instance), "%s last reconciled by another instance", o.Key)
			g.Expect(iv.Open).To(BeFalse(), "%s: reconcile still running", o.Key)
		}
	}).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
}

func readReconcileLogs(g Gomega, dir string) []localrun.ReconcileRecord {
	files, err := filepath.Glob(filepath.Join(dir, "*.jsonl"))
	g.Expect(err).NotTo(HaveOccurred())
	var all []localrun.ReconcileRecord
	for _, f := range files {
		recs, err := localrun.ReadReconcileLog(f)
		g.Expect(err).NotTo(HaveOccurred())
		all = append(all, recs...)
	}
	return all
}

// drainRecorder remembers every EtcdCluster it ever saw with the ring's
// drain label. It watches every event, so a drain that lasts a moment is
// not missed.
type drainRecorder struct {
	mu      sync.Mutex
	drained map[string]bool
}

func newDrainRecorder(ctx context.Context, t *testing.T) *drainRecorder {
	mc, err := metadata.NewForConfig(restConfig)
	if err != nil {
		t.Fatal(err)
	}
	r := &drainRecorder{drained: map[string]bool{}}
	informer := metadatainformer.NewFilteredMetadataInformer(mc, etcdClusterGVR, clustersNamespace, 0, cache.Indexers{}, nil).Informer()
	observe := func(obj any) {
		if m, ok := obj.(*metav1.PartialObjectMetadata); ok && m.Labels[sharderv1alpha1.DrainLabel(operatorRing)] != "" {
			r.mu.Lock()
			r.drained[m.Namespace+"/"+m.Name] = true
			r.mu.Unlock()
		}
	}
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    observe,
		UpdateFunc: func(_, obj any) { observe(obj) },
	}); err != nil {
		t.Fatal(err)
	}
	go informer.Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
		t.Fatal("the drain recorder's watch did not sync")
	}
	return r
}

func (r *drainRecorder) seen(key string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.drained[key]
}
