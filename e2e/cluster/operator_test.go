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
	"github.com/sharder-dev/sharder/internal/reconcilelog"
	"github.com/sharder-dev/sharder/internal/testenv"
	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
)

// The example operator as its kustomization installs it.
const (
	operatorRing      = "etcd-operator"
	operatorNamespace = "etcd-operator-system"
	operatorName      = "etcd-operator"
	clustersNamespace = "etcd-e2e"
	// clusters is how many EtcdClusters the scenario spreads.
	clusters = 12
	// rollClusters is how many there are during the rolling update: the
	// update must move none of them.
	rollClusters = 32
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
// by two pods at once. Then a rolling update, a force-deleted pod, a deleted
// instance Lease and the sharder leader's deleted pod each end with the 4
// instances ready, the EtcdClusters settled and reconciled on them, and no
// overlap.
func testEtcdOperator(t *testing.T) {
	g := NewWithT(t)
	ctx := t.Context()

	By(t, "the operator's kustomization, with each pod's reconcile log on the node")
	logs := operatorLogs
	installOperator(ctx, t, g, logs)
	waitReadyReplicas(ctx, g, 3)

	tracker, err := localrun.NewLabelWatch(restConfig, etcdClusterGVR, clustersNamespace, operatorRing)
	g.Expect(err).NotTo(HaveOccurred())
	labels := newLabelRecorder(ctx, t, etcdClusterGVR, clustersNamespace, operatorRing)
	states := newRingStateRecorder(ctx, t, operatorRing)
	pods := newRolloutRecorder(ctx, t, operatorNamespace, operatorName)
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
		g.Expect(labels.seen(key)).To(BeTrue(), "%s moved without its old instance being asked to drain it", key)
	}
	expectReconciledByOwner(g, logs, after)
	expectNoOverlap(g, logs)

	// Each disruption ends with the 4 instances ready, every EtcdCluster
	// on the instance the ring of the 4 chooses (none left on a gone
	// process), last reconciled there, and none ever reconciled by two
	// processes at once.
	for _, s := range []struct {
		name string
		fn   func(t *testing.T, g Gomega, r recorders)
	}{
		{"rolling update of the StatefulSet", rollOperator},
		{"force-deleted instance pod", forceDeleteInstance},
		{"instance Lease deleted under a running pod", deleteInstanceLease},
		{"sharder leader pod deleted", deleteSharderLeader},
	} {
		if !t.Run(s.name, func(t *testing.T) {
			g := NewWithT(t)
			s.fn(t, g, recorders{tracker: tracker, labels: labels, states: states, pods: pods})
			waitReadyReplicas(ctx, g, 4)
			waitRingReady(ctx, g, operatorRing, instances(4))
			settled := waitSettled(ctx, t, tracker, instances(4))
			expectReconciledByOwner(g, logs, settled)
			expectNoOverlap(g, logs)
			t.Logf("EtcdClusters:\n%s", localrun.FormatCounts(settled.Counts()))
		}) {
			return
		}
	}
}

// recorders are what the scenario watches: the EtcdClusters' labels, the
// ring's member states, and the operator's pods and Leases.
type recorders struct {
	tracker *localrun.LabelWatch
	labels  *labelRecorder
	states  *ringStateRecorder
	pods    *rolloutRecorder
}

// rollOperator restarts the operator's pods (kubectl rollout restart) with
// rollClusters EtcdClusters on them, and waits until every pod has been
// replaced, one by one, under its own name. Each instance hands its Lease
// back marked as restarting (--release=Restart), the sharder keeps its
// objects where they are, and its new pod acquires the Lease at once: no
// EtcdCluster moves, and none is without a reconciling instance for longer
// than its pod's restart and restartSlack. The EtcdClusters added for the
// update are deleted again at its end.
func rollOperator(t *testing.T, g Gomega, r recorders) {
	ctx := t.Context()
	const rolled = "e2e.sharder.dev/rolling-update"
	By(t, fmt.Sprintf("%d EtcdClusters more, %d in all, for the rolling update", rollClusters-clusters, rollClusters))
	for i := range rollClusters - clusters {
		g.Expect(k8sClient.Create(ctx, &etcdv1alpha1.EtcdCluster{
			ObjectMeta: metav1.ObjectMeta{Namespace: clustersNamespace, Name: fmt.Sprintf("etcd-roll-%02d", i), Labels: map[string]string{rolled: "true"}},
			Spec:       etcdv1alpha1.EtcdClusterSpec{Size: 1},
		})).To(Succeed())
	}
	before := waitSettledOn(ctx, t, r.tracker, etcdClusterKind, rollClusters, instances(4))
	expectReconciledByOwner(g, operatorLogs, before)

	By(t, "kubectl rollout restart moves no EtcdCluster")
	start := time.Now()
	old, replaced := rollStatefulSet(ctx, t, g, operatorNamespace, operatorName, 4)
	waitRingReady(ctx, g, operatorRing, instances(4))
	expectNoMoves(t, g, rollout{before: before, start: start, old: old, replaced: replaced, slack: restartSlack,
		logs: operatorLogs, labels: r.labels, states: r.states, pods: r.pods})

	g.Expect(k8sClient.DeleteAllOf(ctx, &etcdv1alpha1.EtcdCluster{}, client.InNamespace(clustersNamespace),
		client.MatchingLabels{rolled: "true"})).To(Succeed())
}

// rollStatefulSet runs kubectl rollout restart on a StatefulSet of n pods
// (labelled app.kubernetes.io/name=name) and waits until each pod has been
// replaced and every replica is updated and Ready. It returns the UIDs of
// the pods before and after, by name.
func rollStatefulSet(ctx context.Context, t *testing.T, g Gomega, namespace, name string, n int) (old, replaced map[string]types.UID) {
	old = podUIDs(ctx, g, namespace, name)
	g.Expect(old).To(HaveLen(n))
	if _, err := kubectl(ctx, "rollout", "restart", "statefulset", name, "--namespace", namespace); err != nil {
		t.Fatal(err)
	}
	g.Eventually(func(g Gomega) {
		var sts appsv1.StatefulSet
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &sts)).To(Succeed())
		g.Expect(sts.Status.ObservedGeneration).To(Equal(sts.Generation))
		g.Expect(sts.Status.UpdatedReplicas).To(Equal(int32(n)))
		g.Expect(sts.Status.CurrentRevision).To(Equal(sts.Status.UpdateRevision))
		g.Expect(sts.Status.ReadyReplicas).To(Equal(int32(n)))
		now := podUIDs(ctx, g, namespace, name)
		g.Expect(now).To(HaveLen(n))
		for pod, uid := range now {
			g.Expect(uid).NotTo(Equal(old[pod]), "%s not replaced yet", pod)
		}
		replaced = now
	}).WithTimeout(4 * time.Minute).WithPolling(time.Second).Should(Succeed())
	return old, replaced
}

// forceDeleteInstance deletes an instance's pod with no grace: the
// StatefulSet creates a new pod of the same name at once. The kubelet still
// stops the old container with SIGTERM, and the instance hands its Lease
// back for a restart (--release=Restart, which drops the pod's
// ownerReference) while the garbage collector deletes the Lease of the
// deleted pod: either may be first. When the collector is, the instance
// vanished: its objects are held until two lease durations after its last
// renewal, and the new pod creates a new Lease. When the instance is, it is
// restarting: the collector leaves the Lease alone, the objects stay, and
// the new pod acquires the same Lease at once; or the collector, having
// read the Lease before the hand-back, still deletes it, and the objects
// are held as in the first case.
func forceDeleteInstance(t *testing.T, g Gomega, r recorders) {
	ctx := t.Context()
	victim := instances(4)[1]
	var pod corev1.Pod
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: operatorNamespace, Name: victim}, &pod)).To(Succeed())
	var lease coordinationv1.Lease
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: operatorNamespace, Name: victim}, &lease)).To(Succeed())
	g.Expect(lease.OwnerReferences).To(ContainElement(HaveField("UID", pod.UID)), "the Lease belongs to its pod")
	held, holdUntil := heldObjects(g, r, victim, &lease)
	killed := time.Now()
	if _, err := kubectl(ctx, "delete", "pod", "--namespace", operatorNamespace, victim, "--force", "--grace-period=0"); err != nil {
		t.Fatal(err)
	}
	var l coordinationv1.Lease
	g.Eventually(func(g Gomega) {
		var now corev1.Pod
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: operatorNamespace, Name: victim}, &now)).To(Succeed())
		g.Expect(now.UID).NotTo(Equal(pod.UID), "the StatefulSet recreates the pod")
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: operatorNamespace, Name: victim}, &l)).To(Succeed())
		g.Expect(l.Spec.HolderIdentity).To(HaveValue(Equal(victim)))
		g.Expect(l.OwnerReferences).To(ContainElement(HaveField("UID", now.UID)), "the new pod holds the Lease")
	}).WithTimeout(3 * time.Minute).WithPolling(time.Second).Should(Succeed())
	collected := l.UID != lease.UID
	// The new pod may hold the Lease again within the ring's
	// StatusInterval, so the ring's status may show the instance's absence
	// or not; it shows nothing but restarting or, once the Lease was
	// collected, vanished. The objects are checked once the ring has
	// settled: a sharder that took the instance for dead would have moved
	// them by then.
	if !collected {
		// The instance handed its Lease back first, marked as restarting,
		// and its objects wait for the new pod.
		var released leaseSeen
		g.Eventually(func(g Gomega) {
			var ok bool
			released, ok = r.pods.releasedSince(victim, killed)
			g.Expect(ok).To(BeTrue(), "%s did not hand its Lease back:\n%s", victim, r.pods.leaseHistory(victim))
		}).WithTimeout(30 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
		g.Expect(released.restarting).To(BeTrue(), "%s handed its Lease back without %s", victim, sharderv1alpha1.AnnotationRestarting)
	}
	waitSettled(ctx, t, r.tracker, instances(4))
	absent := []string{string(membership.StateRestarting)}
	if collected {
		absent = append(absent, string(membership.StateVanished))
	}
	var states []string
	for _, c := range r.states.since(victim, killed) {
		states = append(states, c.State)
	}
	t.Logf("%s after the force delete (Lease collected: %t): ring states %v", victim, collected, states)
	g.Expect(states).To(Or(BeEmpty(), HaveEach(BeElementOf(append(absent, string(membership.StateReady))))),
		"the ring showed %s in another state than %v after its pod was force-deleted", victim, absent)
	g.Expect(r.labels.brokenSince(killed)).To(BeEmpty(), "the label watch broke after the force delete: a move may have been missed")
	if collected {
		expectHeld(t, g, r, victim, held, killed, holdUntil)
		return
	}
	for _, key := range held {
		g.Expect(shardChanges(r.labels.changesSince(key, killed), victim)).To(BeEmpty(), "%s left the restarting %s", key, victim)
	}
}

// deleteInstanceLease deletes a running instance's Lease: the instance
// stops reconciling and creates a new Lease only one lease duration later;
// the sharder meanwhile holds it as vanished, its objects staying put until
// two lease durations after its last renewal.
func deleteInstanceLease(t *testing.T, g Gomega, r recorders) {
	ctx := t.Context()
	victim := instances(4)[2]
	var pod corev1.Pod
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: operatorNamespace, Name: victim}, &pod)).To(Succeed())
	var lease coordinationv1.Lease
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: operatorNamespace, Name: victim}, &lease)).To(Succeed())
	held, holdUntil := heldObjects(g, r, victim, &lease)
	deleted := time.Now()
	g.Expect(k8sClient.Delete(ctx, &lease, client.Preconditions{UID: ptr.To(lease.UID)})).To(Succeed())
	var l coordinationv1.Lease
	g.Eventually(func(g Gomega) {
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: operatorNamespace, Name: victim}, &l)).To(Succeed())
		g.Expect(l.UID).NotTo(Equal(lease.UID))
		g.Expect(l.Spec.HolderIdentity).To(HaveValue(Equal(victim)))
	}).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
	// creationTimestamp has whole seconds.
	g.Expect(l.CreationTimestamp.Add(time.Second)).To(BeTemporally(">=", deleted.Add(operatorLeaseSeconds*time.Second)),
		"%s created its new Lease less than one lease duration after the old one was deleted", victim)
	var now corev1.Pod
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: operatorNamespace, Name: victim}, &now)).To(Succeed())
	g.Expect(now.UID).To(Equal(pod.UID), "the same pod goes on")
	t.Logf("%s after its Lease was deleted: %v", victim, r.states.since(victim, deleted))
	g.Expect(r.states.first(victim, deleted, "vanished", "dead")).To(Equal("vanished"), "the ring shows %s vanished", victim)
	expectHeld(t, g, r, victim, held, deleted, holdUntil)
}

// heldObjects returns the EtcdClusters on instance and the earliest moment
// the sharder may move them if instance vanishes now: two lease durations
// after lease's renewal (the instance may have renewed since, which only
// makes the hold longer).
func heldObjects(g Gomega, r recorders, instance string, lease *coordinationv1.Lease) ([]string, time.Time) {
	g.Expect(lease.Spec.LeaseDurationSeconds).To(HaveValue(Equal(int32(operatorLeaseSeconds))))
	g.Expect(lease.Spec.RenewTime).NotTo(BeNil())
	var held []string
	for _, o := range r.tracker.Assignment() {
		if o.Instance == instance {
			held = append(held, o.Key)
		}
	}
	g.Expect(held).NotTo(BeEmpty(), "%s has no EtcdClusters", instance)
	return held, lease.Spec.RenewTime.Add(2 * operatorLeaseSeconds * time.Second)
}

// expectHeld checks that none of held left instance after from before
// holdUntil.
func expectHeld(t *testing.T, g Gomega, r recorders, instance string, held []string, from, holdUntil time.Time) {
	moved := 0
	for _, key := range held {
		for _, c := range shardChanges(r.labels.changesSince(key, from), instance) {
			if c.Instance != instance {
				moved++
				g.Expect(c.At).NotTo(BeTemporally("<", holdUntil), "%s left the vanished %s for %q at %s, before the hold ended at %s",
					key, instance, c.Instance, c.At.Format(time.StampMilli), holdUntil.Format(time.StampMilli))
			}
		}
	}
	t.Logf("%d EtcdClusters held for the vanished %s until %s; %d moves away after that", len(held), instance, holdUntil.Format(time.StampMilli), moved)
}

// deleteSharderLeader deletes the pod of the sharder's leader: the other
// replica takes over and assigns a new EtcdCluster.
func deleteSharderLeader(t *testing.T, g Gomega, r recorders) {
	ctx := t.Context()
	leader := sharderLeaderPod(ctx, g)
	g.Expect(k8sClient.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: sharderNamespace, Name: leader}})).To(Succeed())
	g.Eventually(func(g Gomega) {
		now := sharderLeaderPod(ctx, g)
		g.Expect(now).NotTo(Equal(leader))
	}).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
	t.Logf("leader %s deleted; %s leads", leader, sharderLeaderPod(ctx, g))

	// The new leader assigns: a new EtcdCluster goes to the instance the
	// ring chooses.
	extra := &etcdv1alpha1.EtcdCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: clustersNamespace, Name: "etcd-after-failover"},
		Spec:       etcdv1alpha1.EtcdClusterSpec{Size: 1},
	}
	g.Expect(k8sClient.Create(ctx, extra)).To(Succeed())
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := r.tracker.Wait(wctx, localrun.SettledOn(etcdClusterKind, clusters+1, instances(4)...)); err != nil {
		t.Fatalf("the new leader did not assign %s: %v", extra.Name, err)
	}
	g.Expect(k8sClient.Delete(ctx, extra)).To(Succeed())
	if err := r.tracker.Wait(wctx, localrun.SettledOn(etcdClusterKind, clusters, instances(4)...)); err != nil {
		t.Fatalf("%s is not gone: %v", extra.Name, err)
	}
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

// podUIDs returns the UID of each pod labelled app.kubernetes.io/name=name
// by name.
func podUIDs(ctx context.Context, g Gomega, namespace, name string) map[string]types.UID {
	var pods corev1.PodList
	g.Expect(k8sClient.List(ctx, &pods, client.InNamespace(namespace), client.MatchingLabels{"app.kubernetes.io/name": name})).To(Succeed())
	uids := map[string]types.UID{}
	for _, p := range pods.Items {
		uids[p.Name] = p.UID
	}
	return uids
}

// waitRingReady waits until the ring's members are exactly ids, each ready.
func waitRingReady(ctx context.Context, g Gomega, ring string, ids []string) {
	g.Eventually(func(g Gomega) {
		var r sharderv1alpha1.ControllerRing
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Name: ring}, &r)).To(Succeed())
		want := make([]any, len(ids))
		for i, id := range ids {
			want[i] = And(HaveField("Name", id), HaveField("State", "ready"))
		}
		g.Expect(r.Status.Members).To(ConsistOf(want...))
		g.Expect(r.Status.AvailableInstances).To(Equal(int32(len(ids))))
	}).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
}

// expectNoOverlap checks that no object was ever reconciled by two
// processes at once: two instances, or two pods of one instance (a pod and
// its replacement under the same name), each pod writing a log of its own.
// A reconcile a killed process left without an end lasts until now.
func expectNoOverlap(g Gomega, logs string) {
	files, err := filepath.Glob(filepath.Join(logs, "*.jsonl"))
	g.Expect(err).NotTo(HaveOccurred())
	var all []reconcilelog.Entry
	for _, f := range files {
		recs, err := reconcilelog.Read(f)
		g.Expect(err).NotTo(HaveOccurred())
		pod := strings.TrimSuffix(filepath.Base(f), ".jsonl")
		for i := range recs {
			recs[i].Instance = pod
		}
		all = append(all, recs...)
	}
	overlaps := reconcilelog.Overlaps(reconcilelog.Intervals(all, nil, time.Now()))
	msgs := make([]string, 0, len(overlaps))
	for _, o := range overlaps {
		msgs = append(msgs, o.String())
	}
	g.Expect(msgs).To(BeEmpty(), "objects reconciled by two processes at once")
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

// installOperator applies examples/etcd-operator/config with two more
// changes: 5 s instance Leases instead of 15 s, so that restarts and a
// vanished instance resolve within seconds, and a readiness probe every
// second instead of every 5 s, so that a pod is seen Ready (its instance
// holds its Lease) within a second of it: a rolling update replaces the
// pods one after another, each once the one before is Ready.
func installOperator(ctx context.Context, t *testing.T, g Gomega, logs string) {
	applyWithReconcileLog(ctx, t, g, filepath.Join(repoRoot, "examples", "etcd-operator", "config"), operatorName, logs, func(sts *appsv1.StatefulSet, c *corev1.Container) {
		g.Expect(*sts.Spec.Replicas).To(Equal(int32(3)), "the kustomization runs 3 instances")
		i := slices.Index(c.Args, "--lease-duration=15s")
		g.Expect(i).NotTo(Equal(-1), "the StatefulSet sets --lease-duration=15s: %v", c.Args)
		c.Args[i] = fmt.Sprintf("--lease-duration=%ds", operatorLeaseSeconds)
		g.Expect(c.ReadinessProbe).NotTo(BeNil(), "the operator's container has a readiness probe")
		c.ReadinessProbe.PeriodSeconds = 1
	})
}

// applyWithReconcileLog applies the kustomization in dir with one change to
// its StatefulSet name: each pod appends its reconcile log to
// logs/<pod name>_<pod UID>.jsonl, a hostPath (its first container gets
// --reconcile-log and the POD_NAME and POD_UID it needs). edit, if not nil,
// changes the StatefulSet and that container further.
func applyWithReconcileLog(ctx context.Context, t *testing.T, g Gomega, dir, name, logs string, edit func(*appsv1.StatefulSet, *corev1.Container)) {
	out, err := kubectl(ctx, "kustomize", dir)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := testenv.DecodeObjects([]byte(out))
	g.Expect(err).NotTo(HaveOccurred())
	var docs []string
	found := false
	for _, o := range objs {
		if o.GetKind() == "StatefulSet" && o.GetName() == name {
			found = true
			var sts appsv1.StatefulSet
			g.Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &sts)).To(Succeed())
			pod := &sts.Spec.Template.Spec
			pod.Volumes = append(pod.Volumes, corev1.Volume{Name: "reconcile-log", VolumeSource: corev1.VolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: logs, Type: ptr.To(corev1.HostPathDirectory)},
			}})
			c := &pod.Containers[0]
			c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "reconcile-log", MountPath: "/reconcile"})
			for _, env := range []corev1.EnvVar{
				{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
				{Name: "POD_UID", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.uid"}}},
			} {
				if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == env.Name }) {
					c.Env = append(c.Env, env)
				}
			}
			// One log per process: a pod that restarts under the same name
			// (the same instance ID) is a new pod with a new UID.
			c.Args = append(c.Args, "--reconcile-log=/reconcile/$(POD_NAME)_$(POD_UID).jsonl")
			if edit != nil {
				edit(&sts, c)
			}
			o.Object, err = runtime.DefaultUnstructuredConverter.ToUnstructured(&sts)
			g.Expect(err).NotTo(HaveOccurred())
		}
		data, err := yaml.Marshal(o.Object)
		g.Expect(err).NotTo(HaveOccurred())
		docs = append(docs, string(data))
	}
	g.Expect(found).To(BeTrue(), "%s has no StatefulSet %s", dir, name)
	manifests := filepath.Join(t.TempDir(), name+".yaml")
	g.Expect(os.WriteFile(manifests, []byte(strings.Join(docs, "---\n")), 0o644)).To(Succeed())
	if _, err := kubectl(ctx, "apply", "--server-side", "--field-manager=e2e", "-f", manifests); err != nil {
		t.Fatal(err)
	}
}

// waitReadyReplicas waits for n Ready operator pods: each holds its Lease.
func waitReadyReplicas(ctx context.Context, g Gomega, n int32) {
	waitStatefulSetReady(ctx, g, operatorNamespace, operatorName, n)
}

// waitStatefulSetReady waits for n Ready pods of a StatefulSet.
func waitStatefulSetReady(ctx context.Context, g Gomega, namespace, name string, n int32) {
	g.Eventually(func(g Gomega) {
		var sts appsv1.StatefulSet
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &sts)).To(Succeed())
		g.Expect(sts.Status.ReadyReplicas).To(Equal(n))
	}).WithTimeout(3 * time.Minute).WithPolling(time.Second).Should(Succeed())
}

// waitSettled waits until every EtcdCluster sits on the instance the ring
// of ids chooses, none draining.
func waitSettled(ctx context.Context, t *testing.T, tracker *localrun.LabelWatch, ids []string) localrun.Assignment {
	t.Helper()
	return waitSettledOn(ctx, t, tracker, etcdClusterKind, clusters, ids)
}

// waitSettledOn waits until the n objects of kind the tracker sees sit on
// the instances the ring of ids chooses, none draining.
func waitSettledOn(ctx context.Context, t *testing.T, tracker *localrun.LabelWatch, kind schema.GroupKind, n int, ids []string) localrun.Assignment {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := tracker.Wait(ctx, localrun.SettledOn(kind, n, ids...)); err != nil {
		t.Fatalf("%d %s objects did not settle on %v: %v\n%s", n, kind.Kind, ids, err, localrun.FormatCounts(tracker.Assignment().Counts()))
	}
	return tracker.Assignment()
}

// expectReconciledByOwner waits until every object of a has last been
// reconciled, to the end, by the instance it is assigned to.
func expectReconciledByOwner(g Gomega, logs string, a localrun.Assignment) {
	g.Eventually(func(g Gomega) {
		last := reconcilelog.LastReconcile(reconcilelog.Intervals(readReconcileLogs(g, logs), nil, time.Now()))
		for _, o := range a {
			iv, ok := last[o.Key]
			g.Expect(ok).To(BeTrue(), "%s never reconciled", o.Key)
			g.Expect(iv.Instance).To(Equal(o.Instance), "%s last reconciled by another instance", o.Key)
			g.Expect(iv.Open).To(BeFalse(), "%s: reconcile still running", o.Key)
		}
	}).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
}

func readReconcileLogs(g Gomega, dir string) []reconcilelog.Entry {
	files, err := filepath.Glob(filepath.Join(dir, "*.jsonl"))
	g.Expect(err).NotTo(HaveOccurred())
	var all []reconcilelog.Entry
	for _, f := range files {
		recs, err := reconcilelog.Read(f)
		g.Expect(err).NotTo(HaveOccurred())
		all = append(all, recs...)
	}
	return all
}

// labelRecorder remembers every object it ever saw with the ring's
// drain label, and every value its shard and drain labels took, with when
// it saw it. It watches every event, so a drain or an assignment that lasts
// a moment is not missed, unless the watch broke and the informer listed
// anew (which it records: the values in between are lost).
type labelRecorder struct {
	mu      sync.Mutex
	drained map[string]bool
	history map[string][]labelChange
	broken  []time.Time
}

// labelChange is a shard label value, with the drain label's value beside
// it, and when the recorder first saw them.
type labelChange struct {
	At       time.Time
	Instance string
	Drain    string
}

func newLabelRecorder(ctx context.Context, t *testing.T, gvr schema.GroupVersionResource, namespace, ring string) *labelRecorder {
	mc, err := metadata.NewForConfig(restConfig)
	if err != nil {
		t.Fatal(err)
	}
	r := &labelRecorder{drained: map[string]bool{}, history: map[string][]labelChange{}}
	informer := metadatainformer.NewFilteredMetadataInformer(mc, gvr, namespace, 0, cache.Indexers{}, nil).Informer()
	observe := func(obj any) {
		m, ok := obj.(*metav1.PartialObjectMetadata)
		if !ok {
			return
		}
		key := m.Namespace + "/" + m.Name
		r.mu.Lock()
		defer r.mu.Unlock()
		drain := m.Labels[sharderv1alpha1.DrainLabel(ring)]
		if drain != "" {
			r.drained[key] = true
		}
		shard := m.Labels[sharderv1alpha1.ShardLabel(ring)]
		if h := r.history[key]; len(h) == 0 || h[len(h)-1].Instance != shard || h[len(h)-1].Drain != drain {
			r.history[key] = append(h, labelChange{At: time.Now(), Instance: shard, Drain: drain})
		}
	}
	if err := informer.SetWatchErrorHandlerWithContext(func(ctx context.Context, rf *cache.Reflector, err error) {
		r.mu.Lock()
		r.broken = append(r.broken, time.Now())
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
		t.Fatal("the label recorder's watch did not sync")
	}
	return r
}

func (r *labelRecorder) seen(key string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.drained[key]
}

// brokenSince returns when the watch broke from since on: label values
// may have been missed around those moments.
func (r *labelRecorder) brokenSince(since time.Time) []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []time.Time
	for _, at := range r.broken {
		if !at.Before(since) {
			out = append(out, at)
		}
	}
	return out
}

// changesSince returns the shard and drain label values key took from
// since on.
func (r *labelRecorder) changesSince(key string, since time.Time) []labelChange {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []labelChange
	for _, c := range r.history[key] {
		if !c.At.Before(since) {
			out = append(out, c)
		}
	}
	return out
}

// ringStateRecorder remembers, per member, the states a ring's status
// showed for it, in order, with when it saw each.
type ringStateRecorder struct {
	mu     sync.Mutex
	states map[string][]stateChange
}

type stateChange struct {
	At    time.Time
	State string
}

func newRingStateRecorder(ctx context.Context, t *testing.T, ring string) *ringStateRecorder {
	wc, err := client.NewWithWatch(restConfig, client.Options{Scheme: k8sClient.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	r := &ringStateRecorder{states: map[string][]stateChange{}}
	record := func(ring *sharderv1alpha1.ControllerRing) {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, m := range ring.Status.Members {
			if h := r.states[m.Name]; len(h) == 0 || h[len(h)-1].State != m.State {
				r.states[m.Name] = append(h, stateChange{At: time.Now(), State: m.State})
			}
		}
	}
	go func() {
		for ctx.Err() == nil {
			w, err := wc.Watch(ctx, &sharderv1alpha1.ControllerRingList{}, client.MatchingFields{"metadata.name": ring})
			if err != nil {
				select {
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
				continue
			}
			for ev := range w.ResultChan() {
				if ring, ok := ev.Object.(*sharderv1alpha1.ControllerRing); ok {
					record(ring)
				}
			}
			w.Stop()
		}
	}()
	return r
}

// since returns the states the ring showed for instance from since on.
func (r *ringStateRecorder) since(instance string, since time.Time) []stateChange {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []stateChange
	for _, c := range r.states[instance] {
		if !c.At.Before(since) {
			out = append(out, c)
		}
	}
	return out
}

// first returns the first of states the ring showed for instance from
// since on ("" if none).
func (r *ringStateRecorder) first(instance string, since time.Time, states ...string) string {
	for _, c := range r.since(instance, since) {
		if slices.Contains(states, c.State) {
			return c.State
		}
	}
	return ""
}
