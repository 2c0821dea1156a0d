package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
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

	intervals := localrun.Intervals(readReconcileLogs(g, logs), nil, time.Now())
	overlaps := localrun.Overlaps(intervals)
	msgs := make([]string, 0, len(overlaps))
	for _, o := range overlaps {
		msgs = append(msgs, o.String())
	}
	g.Expect(msgs).To(BeEmpty(), "EtcdClusters reconciled by two instances at once")
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
			c.Args = append(c.Args, "--reconcile-log=/reconcile/$(POD_NAME).jsonl")
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
