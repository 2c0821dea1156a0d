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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/sharder-dev/sharder/internal/localrun"
	"github.com/sharder-dev/sharder/internal/reconcilelog"
	"github.com/sharder-dev/sharder/internal/testenv"
	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/slots"
)

// testEtcdOperatorSlots: the example operator, as the etcd operator step
// left it (4 instances), switched to its ring's slot-mode variant
// (examples/etcd-operator/config-slots: the operator reads its ring's unit
// at start, nothing else changes): stopped, its ring deleted and created
// anew with unit Slots, started again. Every EtcdCluster gets its slot label
// and is reconciled by its slot's holder. Then a rolling update of the
// StatefulSet writes no object (no EtcdCluster changes its resourceVersion
// from the rollout's start until every cluster was reconciled by the new pod
// of its slot's holder), moves no slot, and no cluster is ever reconciled by
// two pods at once.
func testEtcdOperatorSlots(t *testing.T) {
	g := NewWithT(t)
	ctx := t.Context()

	By(t, "the operator stopped, its ring replaced by the slot-mode variant")
	scaleStatefulSet(ctx, g, operatorNamespace, operatorName, 0)
	g.Eventually(func(g Gomega) {
		g.Expect(podNames(ctx, g, operatorNamespace, "app.kubernetes.io/name="+operatorName)).To(BeEmpty())
	}).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
	// The example's own 15 s Leases again, in place of the 5 s the steps
	// before use: the first instance to start takes every slot and hands
	// most of them on, which stalled the node long enough once for 5 s
	// Leases to expire; a lost Lease moves slots, which this step counts.
	g.Eventually(func() error {
		var sts appsv1.StatefulSet
		if err := k8sClient.Get(ctx, client.ObjectKey{Namespace: operatorNamespace, Name: operatorName}, &sts); err != nil {
			return err
		}
		args := sts.Spec.Template.Spec.Containers[0].Args
		i := slices.Index(args, fmt.Sprintf("--lease-duration=%ds", operatorLeaseSeconds))
		if i == -1 {
			return StopTrying(fmt.Sprintf("the operator runs with --lease-duration=%ds: %v", operatorLeaseSeconds, args))
		}
		args[i] = "--lease-duration=15s"
		return k8sClient.Update(ctx, &sts)
	}).WithTimeout(30 * time.Second).Should(Succeed())
	ring := &sharderv1alpha1.ControllerRing{ObjectMeta: metav1.ObjectMeta{Name: operatorRing}}
	g.Expect(k8sClient.Delete(ctx, ring)).To(Succeed())
	g.Eventually(func() error {
		return k8sClient.Get(ctx, client.ObjectKeyFromObject(ring), ring)
	}).WithTimeout(2*time.Minute).WithPolling(time.Second).Should(MatchError(ContainSubstring("not found")), "the ring's finalizer ends")
	applySlotRing(ctx, t, g)

	By(t, "4 instances in slot mode: every EtcdCluster on its slot's holder")
	scaleStatefulSet(ctx, g, operatorNamespace, operatorName, 4)
	waitReadyReplicas(ctx, g, 4)
	waitRingReady(ctx, g, operatorRing, instances(4))
	before := waitSlotsSettled(ctx, g, instances(4))
	expectReconciledByOwner(g, operatorLogs, before.assignment)
	t.Logf("slot table revision %d: %s", before.revision, localrun.FormatCounts(before.assignment.Counts()))

	By(t, "a rolling update writes no object and moves no slot")
	writes := newWriteRecorder(ctx, t)
	start := time.Now()
	_, replaced := rollStatefulSet(ctx, t, g, operatorNamespace, operatorName, 4)
	waitRingReady(ctx, g, operatorRing, instances(4))
	// Each cluster reconciled by the new pod of its slot's holder.
	g.Eventually(func(g Gomega) {
		for _, o := range before.assignment {
			recs, err := reconcilelog.Read(filepath.Join(operatorLogs, fmt.Sprintf("%s_%s.jsonl", o.Instance, replaced[o.Instance])))
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(slices.ContainsFunc(recs, func(r reconcilelog.Entry) bool {
				return r.Object == o.Key && r.Phase == reconcilelog.PhaseEnd
			})).To(BeTrue(), "%s not reconciled by the new pod of %s yet", o.Key, o.Instance)
		}
	}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
	end := time.Now()
	after := waitSlotsSettled(ctx, g, instances(4))
	// The operator's reconciles may write a cluster's status as they see it
	// change (its members' health): the operator's business, told apart
	// from any other write (a label, the sharder's).
	var objectWrites, statusWrites []objectWrite
	for _, w := range writes.between(start, end) {
		if w.Writer == "etcd-operator/status" && !w.Metadata {
			statusWrites = append(statusWrites, w)
		} else {
			objectWrites = append(objectWrites, w)
		}
	}
	t.Logf("rolling update of 4 pods in slot mode (%s): %d EtcdCluster writes (besides %d status writes of the operator's reconciles: %v), "+
		"slot table revision %d → %d", end.Sub(start).Round(100*time.Millisecond), len(objectWrites), len(statusWrites), statusWrites,
		before.revision, after.revision)
	g.Expect(writes.broken()).To(BeZero(), "the EtcdClusters' watch broke: a write may have been missed")
	g.Expect(objectWrites).To(BeEmpty(), "EtcdClusters written during the rolling update")
	g.Expect(after.holders).To(Equal(before.holders), "slots moved during the rolling update")
	expectReconciledByOwner(g, operatorLogs, after.assignment)
	expectNoOverlap(g, operatorLogs)
}

// applySlotRing applies the ControllerRing of
// examples/etcd-operator/config-slots.
func applySlotRing(ctx context.Context, t *testing.T, g Gomega) {
	out, err := kubectl(ctx, "kustomize", filepath.Join(repoRoot, "examples", "etcd-operator", "config-slots"))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := testenv.DecodeObjects([]byte(out))
	g.Expect(err).NotTo(HaveOccurred())
	i := slices.IndexFunc(objs, func(o *unstructured.Unstructured) bool {
		return o.GetKind() == "ControllerRing" && o.GetName() == operatorRing
	})
	g.Expect(i).NotTo(Equal(-1), "config-slots has no ring %s", operatorRing)
	data, err := yaml.Marshal(objs[i].Object)
	g.Expect(err).NotTo(HaveOccurred())
	manifest := filepath.Join(t.TempDir(), "ring.yaml")
	g.Expect(os.WriteFile(manifest, data, 0o644)).To(Succeed())
	if _, err := kubectl(ctx, "apply", "--server-side", "--field-manager=e2e", "-f", manifest); err != nil {
		t.Fatal(err)
	}
	var r sharderv1alpha1.ControllerRing
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Name: operatorRing}, &r)).To(Succeed())
	g.Expect(r.Spec.AssignsSlots()).To(BeTrue())
}

// slotsSettled is a slot ring at rest: its table's revision, the holder of
// every slot, and the EtcdClusters of clustersNamespace on their slots'
// holders.
type slotsSettled struct {
	revision   int64
	holders    []string
	assignment localrun.Assignment
}

// waitSlotsSettled waits until the operator's ring grants every slot to one
// of ids (none releasing, none unassigned), each within one slot of its
// share, and every EtcdCluster of clustersNamespace carries its slot label.
func waitSlotsSettled(ctx context.Context, g Gomega, ids []string) slotsSettled {
	var out slotsSettled
	g.Eventually(func(g Gomega) {
		var r sharderv1alpha1.ControllerRing
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Name: operatorRing}, &r)).To(Succeed())
		count := r.Spec.EffectiveSlotCount()
		tb, err := slots.FromStatus(count, r.Status.Slots)
		g.Expect(err).NotTo(HaveOccurred())
		held := map[string]int{}
		for s, sl := range tb.Slots {
			g.Expect(sl.Holder).To(BeElementOf(ids), "slot %d (revision %d)", s, tb.Revision)
			g.Expect(sl.Releasing).To(BeFalse(), "slot %d releasing (revision %d)", s, tb.Revision)
			held[sl.Holder]++
		}
		for _, id := range ids {
			g.Expect(held[id]).To(BeNumerically(">=", count/len(ids)), "%s's slots (revision %d)", id, tb.Revision)
		}
		var list metav1.PartialObjectMetadataList
		list.SetGroupVersionKind(etcdClusterGVR.GroupVersion().WithKind("EtcdClusterList"))
		g.Expect(k8sClient.List(ctx, &list, client.InNamespace(clustersNamespace))).To(Succeed())
		a := make(localrun.Assignment, 0, len(list.Items))
		for _, m := range list.Items {
			if m.DeletionTimestamp != nil {
				continue
			}
			v, ok := m.Labels[sharderv1alpha1.SlotLabel(operatorRing)]
			g.Expect(ok).To(BeTrue(), "%s has no slot label", m.Name)
			slot, err := slots.ParseLabel(v, count)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(slot).To(Equal(slots.ForMainObject(&r.Spec, etcdClusterKind.Group, etcdClusterKind.Kind, m.Namespace, m.Name)), "%s's slot", m.Name)
			a = append(a, localrun.ObjectState{Key: m.Namespace + "/" + m.Name, Instance: tb.Slots[slot].Holder, Generation: m.Generation})
		}
		g.Expect(a).To(HaveLen(clusters))
		out = slotsSettled{revision: tb.Revision, holders: tb.Holders(), assignment: a}
	}).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
	return out
}

// writeRecorder records every update of an EtcdCluster of any namespace,
// with who wrote it last (its managed fields' latest entry) and whether it
// changed its metadata.
type writeRecorder struct {
	mu       sync.Mutex
	rvs      map[string]string
	metas    map[string]string
	writes   []objectWrite
	breakage int
}

type objectWrite struct {
	At     time.Time
	Key    string
	Writer string
	// Metadata: the write changed labels, annotations or finalizers.
	Metadata bool
}

func newWriteRecorder(ctx context.Context, t *testing.T) *writeRecorder {
	mc, err := metadata.NewForConfig(restConfig)
	if err != nil {
		t.Fatal(err)
	}
	r := &writeRecorder{rvs: map[string]string{}, metas: map[string]string{}}
	informer := metadatainformer.NewFilteredMetadataInformer(mc, etcdClusterGVR, "", 0, cache.Indexers{}, nil).Informer()
	observe := func(obj any) {
		m, ok := obj.(*metav1.PartialObjectMetadata)
		if !ok {
			return
		}
		key := m.Namespace + "/" + m.Name
		r.mu.Lock()
		defer r.mu.Unlock()
		meta := fmt.Sprint(m.Labels, m.Annotations, m.Finalizers)
		if prev, ok := r.rvs[key]; ok && prev != m.ResourceVersion {
			r.writes = append(r.writes, objectWrite{At: time.Now(), Key: key, Writer: lastWriter(m), Metadata: meta != r.metas[key]})
		}
		r.rvs[key], r.metas[key] = m.ResourceVersion, meta
	}
	if err := informer.SetWatchErrorHandlerWithContext(func(ctx context.Context, rf *cache.Reflector, err error) {
		r.mu.Lock()
		r.breakage++
		r.mu.Unlock()
		cache.DefaultWatchErrorHandler(ctx, rf, err)
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    observe,
		UpdateFunc: func(_, obj any) { observe(obj) },
	}); err != nil {
		t.Fatal(err)
	}
	go informer.Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
		t.Fatal("the write recorder's watch did not sync")
	}
	return r
}

func (r *writeRecorder) between(from, to time.Time) []objectWrite {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []objectWrite
	for _, w := range r.writes {
		if !w.At.Before(from) && !w.At.After(to) {
			out = append(out, w)
		}
	}
	return out
}

func (r *writeRecorder) broken() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.breakage
}

// lastWriter names the field manager (and subresource) of the latest entry
// of an object's managed fields.
func lastWriter(m *metav1.PartialObjectMetadata) string {
	var last *metav1.ManagedFieldsEntry
	for i := range m.ManagedFields {
		f := &m.ManagedFields[i]
		if f.Time != nil && (last == nil || !f.Time.Before(last.Time)) {
			last = f
		}
	}
	if last == nil {
		return "?"
	}
	return strings.TrimSuffix(last.Manager+"/"+last.Subresource, "/")
}
