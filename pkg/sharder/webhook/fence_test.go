package webhook_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/sharder/webhook"
	"github.com/sharder-dev/sharder/pkg/slots"
)

// TestOnlyTheLeaderMovesObjects: every sharder replica writes as the same
// ServiceAccount, so the webhook tells them apart by the field manager of
// the write, which names the replica's leader-election identity, and
// allows the label writes of the replica that holds the leader-election
// Lease only: a replica frozen past the end of its leadership that resumes
// has its writes denied.
func TestOnlyTheLeaderMovesObjects(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := env().Namespace(t)
	r := createRing(t, ns)
	key := types.NamespacedName{Namespace: sharderNamespace, Name: "leader-" + rand.String(5)}
	now := metav1.NewMicroTime(time.Now())
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("replica-a_1"), LeaseDurationSeconds: ptr.To[int32](60),
			AcquireTime: &now, RenewTime: &now},
	}
	g.Expect(setupUsers()).To(Succeed()) // the sharder's namespace
	g.Expect(env().Client.Create(ctx, lease)).To(Succeed())
	t.Cleanup(func() { _ = env().Client.Delete(context.Background(), lease) })
	startSharder(t, webhook.Options{LeaderLease: key})

	shard := v1alpha1.ShardLabel(r.Name)
	sh := clientAs(t, sharderUser)
	cm := labelled(ns, "moved", nil)
	g.Expect(env().Client.Create(ctx, cm)).To(Succeed())
	move := func(to, replica string) error {
		patch := []byte(`{"metadata":{"labels":{"` + shard + `":"` + to + `"}}}`)
		opts := []client.PatchOption{}
		if replica != "" {
			opts = append(opts, client.FieldOwner(webhook.LeaderFieldManager(replica)))
		}
		return sh.Patch(ctx, labelled(ns, cm.Name, nil), client.RawPatch(types.MergePatchType, patch), opts...)
	}

	// Once the configuration is active, a write by a replica that does not
	// lead is denied, naming the leader.
	attempt := 0
	g.Eventually(func(g Gomega) {
		attempt++ // a new value each time: a write that changes nothing is allowed
		expectDenied(g, move(fmt.Sprintf("probe-%d", attempt), "replica-b_2"), "replica-a_1", "sharder/replica-b_2", `ring "`+r.Name+`"`)
	}, 30*time.Second, 200*time.Millisecond).Should(Succeed())
	g.Expect(move("inst-a", "replica-a_1")).To(Succeed(), "the leader's write")
	expectDenied(g, move("inst-b", ""), "replica-a_1")

	// replica-b takes over: replica-a's writes are denied from now on.
	g.Expect(env().Client.Get(ctx, client.ObjectKeyFromObject(lease), lease)).To(Succeed())
	now = metav1.NewMicroTime(time.Now())
	lease.Spec.HolderIdentity, lease.Spec.AcquireTime, lease.Spec.RenewTime = ptr.To("replica-b_2"), &now, &now
	g.Expect(env().Client.Update(ctx, lease)).To(Succeed())
	g.Eventually(func() error { return move("inst-b", "replica-b_2") }, 10*time.Second, 50*time.Millisecond).Should(Succeed())
	expectDenied(g, move("inst-c", "replica-a_1"), "replica-b_2", "sharder/replica-a_1")

	g.Expect(sh.Get(ctx, client.ObjectKeyFromObject(cm), cm)).To(Succeed())
	g.Expect(cm.Labels).To(HaveKeyWithValue(shard, "inst-b"), "a denied write changed the object")
}

// BenchmarkLeaderWriteLatency measures what fencing costs the sharder's own
// label writes: at a steady 200 requests/s, a dry-run update by the leader
// changing the shard label, which now goes through the webhook (fenced),
// against update-baseline, the same update changing another label (not
// sent to the webhook, as the sharder's writes were before fencing).
//
// Run: go test ./pkg/sharder/webhook -run '^$' -bench LeaderWriteLatency
func BenchmarkLeaderWriteLatency(b *testing.B) {
	ctx := context.Background()
	ns := env().Namespace(b)
	r := createRing(b, ns)
	key := types.NamespacedName{Namespace: sharderNamespace, Name: "leader-" + rand.String(5)}
	now := metav1.NewMicroTime(time.Now())
	if err := setupUsers(); err != nil {
		b.Fatal(err)
	}
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To("replica-a_1"), LeaseDurationSeconds: ptr.To[int32](3600), RenewTime: &now},
	}
	if err := env().Client.Create(ctx, lease); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = env().Client.Delete(context.Background(), lease) })
	startSharder(b, webhook.Options{LeaderLease: key})
	shard := v1alpha1.ShardLabel(r.Name)
	sh := clientAs(b, sharderUser)
	probe := labelled(ns, "probe", map[string]string{shard: "inst-a"})
	if err := env().Client.Create(ctx, probe); err != nil {
		b.Fatal(err)
	}
	leader := client.FieldOwner(webhook.LeaderFieldManager("replica-a_1"))
	// Wait until the webhook decides the leader's writes: another replica's
	// is denied.
	deadline := time.Now().Add(30 * time.Second)
	for {
		cm := probe.DeepCopy()
		cm.Labels = map[string]string{shard: "inst-b"}
		err := sh.Update(ctx, cm, client.DryRunAll, client.FieldOwner(webhook.LeaderFieldManager("replica-b_2")))
		if apierrors.IsForbidden(err) {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("the webhook does not fence the sharder's writes: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	update := func(key, value string) func(int) error {
		return func(int) error {
			cm := probe.DeepCopy()
			cm.Labels = map[string]string{shard: probe.Labels[shard], key: value}
			return sh.Update(ctx, cm, client.DryRunAll, leader)
		}
	}
	for _, run := range []struct {
		name string
		do   func(i int) error
	}{
		{"update-baseline", update("team", "b")},
		{"update-fenced", update(shard, "inst-b")},
	} {
		b.Run(run.name, func(b *testing.B) {
			before := webhookCalls(r.Name)
			for range b.N {
				p50, p99, errs := measure(run.do)
				b.ReportMetric(float64(p50.Microseconds())/1000, "p50-ms")
				b.ReportMetric(float64(p99.Microseconds())/1000, "p99-ms")
				b.ReportMetric(float64(errs), "errors")
			}
			b.ReportMetric(webhookCalls(r.Name)-before, "webhook-calls")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// TestLateMoveOffABackInstanceIsDenied: the sharder moves a main object
// off an instance without a drain only while the instance is gone, under
// its hold of the instance's Lease. A sharder paused between that decision
// and its write (a long garbage collection, SIGSTOP, a paused VM) sends the
// write after the instance acquired its Lease again, however long the pause
// lasted: the webhook reads the Lease from the API server at admission and
// denies the move while the instance holds it. Moves off an instance whose
// Lease the sharder holds, is absent or released, and the forced release
// of an object (the shard label removed), stay allowed.
func TestLateMoveOffABackInstanceIsDenied(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := env().Namespace(t)
	r := createRing(t, ns)
	shard := v1alpha1.ShardLabel(r.Name)
	g.Expect(setupUsers()).To(Succeed())
	startSharder(t, webhook.Options{})
	waitProtected(t, r.Name, ns)

	sh := clientAs(t, sharderUser)
	cm := labelled(ns, "on-b", map[string]string{shard: "b"})
	g.Expect(sh.Create(ctx, cm)).To(Succeed())
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "child-on-b", Labels: map[string]string{shard: "b"}}}
	g.Expect(sh.Create(ctx, secret)).To(Succeed())
	move := func(obj client.Object, to string) error {
		return relabel(sh, obj, func(l map[string]string) {
			if to == "" {
				delete(l, shard)
			} else {
				l[shard] = to
			}
		}, client.DryRunAll)
	}
	hold := func(holder string) {
		lease := &coordinationv1.Lease{}
		g.Expect(env().Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "b"}, lease)).To(Succeed())
		now := metav1.NewMicroTime(time.Now())
		lease.Spec.HolderIdentity, lease.Spec.RenewTime = ptr.To(holder), &now
		g.Expect(env().Client.Update(ctx, lease)).To(Succeed())
	}

	// No Lease: nobody holds the instance's ID.
	g.Expect(move(cm, "a")).To(Succeed())
	// The sharder holds b's Lease: the move it decided lands.
	createLease(t, env().Client, ns, r.Name, "b", time.Now(), time.Minute)
	hold("sharder:replica-a")
	g.Expect(move(cm, "a")).To(Succeed())

	// b is back: it acquired its Lease. The move decided before is denied,
	// whatever the sharder's caches say; the forced release of an object of a
	// ready instance, and a controlled object following its owner, are not.
	hold("b")
	expectDenied(g, move(cm, "a"), `instance "b"`, "holds its Lease again")
	g.Expect(move(cm, "")).To(Succeed(), "a forced release")
	g.Expect(move(secret, "a")).To(Succeed(), "a controlled object")

	// Released: b holds nothing.
	hold("")
	g.Expect(move(cm, "a")).To(Succeed())

	g.Expect(sh.Get(ctx, client.ObjectKeyFromObject(cm), cm)).To(Succeed())
	g.Expect(cm.Labels).To(HaveKeyWithValue(shard, "b"), "the dry runs changed nothing")
}

// TestLateGrantOffABackInstanceIsDenied is TestLateMoveOffABackInstanceIsDenied
// for a ring of unit Slots: the sharder grants away a slot of an instance
// without its acknowledgement only while the instance is gone, under its
// hold of the instance's Lease. A table write decided so and sent after the
// instance acquired its Lease again (a sharder paused between decision and
// write, however long) is denied: the webhook reads the Lease of every
// instance that loses a slot from the API server at admission. A slot whose
// release the instance acknowledged passes on while it runs; an instance
// whose Lease the sharder holds, that released it or has none loses its
// slots; writes of the status that leave the table as it is never reach
// the webhook, nor do tables written by someone else.
func TestLateGrantOffABackInstanceIsDenied(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := env().Namespace(t)
	r := createRing(t, ns, func(r *v1alpha1.ControllerRing) {
		r.Spec.Assignment = &v1alpha1.RingAssignment{Unit: v1alpha1.AssignmentUnitSlots, Slots: &v1alpha1.RingSlots{Count: 4}}
	})
	g.Expect(setupUsers()).To(Succeed())
	startSharder(t, webhook.Options{})
	sh := clientAs(t, sharderUser)

	// Revision 2: b holds slots 0 and 1, asked at revision 2 to release
	// slot 1; a holds 2 and 3. Written by someone else: not checked.
	table := func(revision int64, set func(*slots.Table)) slots.Table {
		tb := slots.NewTable(4)
		tb.Revision = revision
		tb.Slots[0], tb.Slots[1] = slots.Slot{Holder: "b"}, slots.Slot{Holder: "b", Releasing: true, Since: 2}
		tb.Slots[2], tb.Slots[3] = slots.Slot{Holder: "a"}, slots.Slot{Holder: "a"}
		if set != nil {
			set(&tb)
		}
		return tb
	}
	g.Expect(env().Client.Get(ctx, client.ObjectKeyFromObject(r), r)).To(Succeed())
	r.Status.Slots = table(2, nil).Status()
	g.Expect(env().Client.Status().Update(ctx, r)).To(Succeed())
	write := func(next slots.Table) error {
		updated := r.DeepCopy()
		updated.Status.Slots = next.Status()
		return sh.Status().Patch(ctx, updated, client.MergeFromWithOptions(r, client.MergeFromWithOptimisticLock{}), client.DryRunAll)
	}
	grantGranted := table(3, func(tb *slots.Table) { tb.Slots[0] = slots.Slot{Holder: "a"} })
	grantReleased := table(3, func(tb *slots.Table) { tb.Slots[1] = slots.Slot{Holder: "a"} })
	lease := &coordinationv1.Lease{}
	leaseKey := types.NamespacedName{Namespace: ns, Name: "b"}
	set := func(change func(*coordinationv1.Lease)) {
		g.Expect(env().Client.Get(ctx, leaseKey, lease)).To(Succeed())
		change(lease)
		g.Expect(env().Client.Update(ctx, lease)).To(Succeed())
	}

	// b is back: it holds its Lease. A grant of its slot decided before is
	// denied once the configuration applies, whatever the sharder's caches
	// say, and so is the end of a release it did not acknowledge.
	createLease(t, env().Client, ns, r.Name, "b", time.Now(), time.Minute)
	g.Eventually(func(g Gomega) {
		expectDenied(g, write(grantGranted), `instance "b"`, "a slot granted to it", "holds its Lease again")
	}, 30*time.Second, 200*time.Millisecond).Should(Succeed())
	expectDenied(g, write(grantReleased), `instance "b"`, "release at revision 2", "acknowledged revision 0")

	// b acknowledges revision 2: its released slot passes on, its granted
	// one stays.
	set(func(l *coordinationv1.Lease) {
		l.Annotations = map[string]string{v1alpha1.AnnotationSlotsAcknowledged: string(r.UID) + "/2"}
	})
	g.Expect(write(grantReleased)).To(Succeed())
	expectDenied(g, write(grantGranted), `instance "b"`, "a slot granted to it")

	// An acknowledgement of another ring (another UID) counts for nothing.
	set(func(l *coordinationv1.Lease) { l.Annotations[v1alpha1.AnnotationSlotsAcknowledged] = "other-uid/9" })
	expectDenied(g, write(grantReleased), `instance "b"`)

	// The sharder holds b's Lease, b released it, b has none: b is gone,
	// the grants decided under the hold land.
	set(func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = ptr.To("sharder:replica-a") })
	g.Expect(write(grantGranted)).To(Succeed())
	set(func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = ptr.To("") })
	g.Expect(write(grantGranted)).To(Succeed())
	g.Expect(env().Client.Delete(ctx, lease)).To(Succeed())
	g.Expect(write(grantGranted)).To(Succeed())

	// With b holding its Lease again, a status write that leaves the table
	// as it is, and a table written by another user, are not sent to the
	// webhook.
	createLease(t, env().Client, ns, r.Name, "b", time.Now(), time.Minute)
	expectDenied(g, write(grantGranted), `instance "b"`)
	before := webhookCalls(r.Name)
	updated := r.DeepCopy()
	updated.Status.Conditions = append(updated.Status.Conditions, metav1.Condition{Type: "Probe", Status: metav1.ConditionTrue,
		Reason: "Probe", LastTransitionTime: metav1.Now()})
	g.Expect(sh.Status().Patch(ctx, updated, client.MergeFrom(r), client.DryRunAll)).To(Succeed())
	other := r.DeepCopy()
	other.Status.Slots = grantGranted.Status()
	g.Expect(clientAs(t, userAlice).Status().Patch(ctx, other, client.MergeFrom(r), client.DryRunAll)).To(Succeed())
	g.Expect(webhookCalls(r.Name)).To(Equal(before), "requests that were not the sharder's table writes reached the webhook")

	g.Expect(env().Client.Get(ctx, client.ObjectKeyFromObject(r), r)).To(Succeed())
	g.Expect(r.Status.Slots).To(Equal(table(2, nil).Status()), "the dry runs changed the table")
}
