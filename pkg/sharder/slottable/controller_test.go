package slottable_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/internal/fixture"
	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/sharder/leasecontroller"
	"github.com/sharder-dev/sharder/pkg/sharder/metrics"
	"github.com/sharder-dev/sharder/pkg/sharder/slotpolicy"
	"github.com/sharder-dev/sharder/pkg/sharder/slottable"
	"github.com/sharder-dev/sharder/pkg/slots"
)

// TestGrantReleaseAcknowledge: three ready instances get all 64 slots,
// balanced within one; a fourth makes the others release slots in one
// write, and it is granted none of them before their holders acknowledged
// the revision that asked; once they have, it gets them. Every table write
// raises the revision by one, and a membership change costs a few writes.
// The ring's policy binding is written.
func TestGrantReleaseAcknowledge(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ring, ns := newRing(t, 64)
	for _, id := range []string{"a", "b", "c"} {
		createLease(t, ring.Name, ns, id, 60)
	}
	s := startSharder(t, ring.Name, ns, slottable.Options{})

	g.Eventually(tableOf(ring)).Should(Satisfy(balanced("a", "b", "c")))
	initial := s.settled(g, ring, 0)
	g.Expect(initial).To(BeNumerically("<=", 3), "writes to grant a new ring's slots")
	g.Consistently(func() int { return len(s.successful()) }).Should(Equal(initial), "writes with nothing changing")

	createLease(t, ring.Name, ns, "d", 60)
	var released slots.Table
	g.Eventually(func(g Gomega) {
		tbl, err := tableOf(ring)()
		g.Expect(err).NotTo(HaveOccurred())
		h := holdings(tbl)
		g.Expect(h["a"].releasing + h["b"].releasing + h["c"].releasing).To(Equal(16))
		released = tbl
	}).Should(Succeed())
	g.Expect(released.Revision).To(Equal(int64(initial + 1)))
	g.Expect(holdings(released)["d"]).To(Equal(held{}))
	// Unacknowledged, nothing moves.
	g.Consistently(tableOf(ring)).Should(HaveField("Revision", released.Revision))

	// Two acknowledge: their slots go to d, the third's wait.
	acknowledge(g, ring, ns, "a", released.Revision)
	acknowledge(g, ring, ns, "b", released.Revision)
	g.Eventually(func(g Gomega) {
		tbl, err := tableOf(ring)()
		g.Expect(err).NotTo(HaveOccurred())
		h := holdings(tbl)
		g.Expect(h["a"].releasing + h["b"].releasing).To(BeZero())
		g.Expect(h["c"].releasing).To(BeNumerically(">", 0))
		g.Expect(h["d"].granted).To(Equal(16 - h["c"].releasing))
	}).Should(Succeed())
	g.Consistently(func() int { return holdings(must(tableOf(ring)()))["c"].releasing }).Should(BeNumerically(">", 0))

	acknowledge(g, ring, ns, "c", released.Revision)
	g.Eventually(tableOf(ring)).Should(Satisfy(balanced("a", "b", "c", "d")))
	final := must(tableOf(ring)())
	g.Eventually(func() int64 { return int64(len(s.successful())) }).Should(Equal(final.Revision), "one revision per write")
	writes := s.successful()
	for i, w := range writes {
		g.Expect(w.table.Revision).To(Equal(int64(i+1)), "write %d", i)
	}
	g.Expect(len(writes)-initial).To(BeNumerically("<=", 4), "writes for one new instance and three acknowledgements")

	// The metrics: 16 slots moved on acknowledgements, each with its time
	// from release to grant; each instance's slots as the table says. The
	// controller records them once its write returned, which may be a
	// moment after the table is seen.
	g.Eventually(func() float64 {
		return testutil.ToFloat64(metrics.SlotMovesTotal.WithLabelValues(ring.Name, metrics.SlotMoveRelease))
	}).Should(BeEquivalentTo(16))
	g.Expect(testutil.ToFloat64(metrics.SlotMovesTotal.WithLabelValues(ring.Name, metrics.SlotMoveGone))).To(BeZero())
	g.Expect(histogramCount(g, ring.Name)).To(BeEquivalentTo(16))
	g.Eventually(func(g Gomega) {
		for id, h := range holdings(final) {
			g.Expect(testutil.ToFloat64(metrics.Slots.WithLabelValues(ring.Name, id))).To(BeEquivalentTo(h.granted+h.releasing), id)
		}
	}).Should(Succeed())

	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
	g.Eventually(func() error {
		return env().Client.Get(context.Background(), client.ObjectKey{Name: slotpolicy.BindingName(ring.Name)}, binding)
	}).Should(Succeed())
	g.Expect(binding.OwnerReferences).To(ConsistOf(HaveField("UID", ring.UID)))
	g.Expect(binding.Spec.PolicyName).To(Equal(slotpolicy.PolicyName))
}

// TestDeadInstance: the slots of an instance that released its Lease are
// granted to the others at once, with no release, while the sharder holds
// its Lease; the hold ends once the table grants it no slot.
func TestDeadInstance(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ring, ns := newRing(t, 64)
	createLease(t, ring.Name, ns, "a", 60)
	createLease(t, ring.Name, ns, "b", 60)
	createLease(t, ring.Name, ns, "c", 3)
	s := startSharder(t, ring.Name, ns, slottable.Options{})
	g.Eventually(tableOf(ring)).Should(Satisfy(balanced("a", "b", "c")))
	before := s.settled(g, ring, 0)

	updateLease(g, ns, "c", fixture.Released)
	g.Eventually(tableOf(ring)).Should(Satisfy(balanced("a", "b")))
	g.Eventually(func() int { return len(s.successful()) }).Should(Equal(before+1), "one write grants a dead instance's slots")
	writes := s.successful()
	g.Eventually(func() float64 {
		return testutil.ToFloat64(metrics.SlotMovesTotal.WithLabelValues(ring.Name, metrics.SlotMoveGone))
	}).Should(BeNumerically(">=", 21), "c's slots, a third of 64")

	// The sharder held the Lease while the slots moved (a takeover counts a
	// transition), and released it after.
	g.Eventually(fixture.GetLease(env().Client, ns, "c")).Should(And(
		HaveField("Spec.HolderIdentity", Equal(ptr.To(""))),
		HaveField("Spec.LeaseTransitions", Equal(ptr.To(int32(1)))),
	))
	release := must(fixture.GetLease(env().Client, ns, "c")()).Spec.RenewTime.Time
	g.Expect(release).To(BeTemporally(">=", writes[len(writes)-1].at.Add(-time.Millisecond)), "the hold ended after the write returned")
}

// TestWithdraw: a new instance that goes away before the releases for it
// were acknowledged makes the sharder withdraw them, in one more write.
func TestWithdraw(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ring, ns := newRing(t, 64)
	for _, id := range []string{"a", "b", "c"} {
		createLease(t, ring.Name, ns, id, 60)
	}
	s := startSharder(t, ring.Name, ns, slottable.Options{})
	g.Eventually(tableOf(ring)).Should(Satisfy(balanced("a", "b", "c")))
	before := s.settled(g, ring, 0)

	createLease(t, ring.Name, ns, "d", 60)
	g.Eventually(func() int { return holdings(must(tableOf(ring)()))["a"].releasing }).Should(BeNumerically(">", 0))
	updateLease(g, ns, "d", fixture.Released)
	g.Eventually(tableOf(ring)).Should(Satisfy(balanced("a", "b", "c")))
	g.Expect(s.settled(g, ring, 0)).To(Equal(before+2), "a write to release and one to withdraw")
	g.Consistently(func() int { return len(s.successful()) }).Should(Equal(before + 2))
}

// TestUnknownHolder: the slots of a holder the sharder has no Lease of stay
// with it for the lease controller's UnknownHold after the sharder counted
// them (it may be an instance this sharder has not seen yet), then go to
// ready instances, and only once the sharder created the holder's Lease
// and holds it: a process with the holder's ID that comes back finds its
// Lease held and waits, instead of creating it and starting on slots that
// are being granted away.
func TestUnknownHolder(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ring, ns := newRing(t, 64)
	table := &v1alpha1.SlotTable{Revision: 1, Instances: []v1alpha1.SlotHolder{{Name: "ghost", Granted: "0-15"}}}
	patch := client.RawPatch(types.MergePatchType, mustJSON(map[string]any{"status": map[string]any{"slots": table}}))
	g.Expect(env().Client.Status().Patch(context.Background(), &v1alpha1.ControllerRing{ObjectMeta: metav1.ObjectMeta{Name: ring.Name}}, patch)).To(Succeed())
	createLease(t, ring.Name, ns, "a", 60)
	createLease(t, ring.Name, ns, "b", 60)
	start := time.Now()
	const hold = 2 * time.Second
	s := startSharderWith(t, ring.Name, ns, leasecontroller.Options{UnknownHold: hold}, slottable.Options{})

	g.Eventually(func() map[string]held { return holdings(must(tableOf(ring)())) }).Should(Equal(map[string]held{
		"ghost": {granted: 16}, "a": {granted: 16}, "b": {granted: 32},
	}))
	g.Eventually(tableOf(ring)).Should(Satisfy(balanced("a", "b")))
	n := s.settled(g, ring, 1)
	last := s.successful()[n-1]
	g.Expect(last.at.Sub(start)).To(BeNumerically(">=", hold), "the unknown holder's slots moved after the hold")
	lease := &coordinationv1.Lease{}
	g.Expect(env().Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "ghost"}, lease)).To(Succeed(),
		"the sharder created the ghost's Lease to hold it")
	g.Expect(lease.Labels).To(HaveKeyWithValue(v1alpha1.LabelRing, ring.Name))
	g.Expect(lease.Spec.AcquireTime).NotTo(BeNil())
	g.Expect(lease.Spec.AcquireTime.Time).To(BeTemporally("<", last.at), "the Lease was held before the slots were granted away")
}

// TestInvalidTable: a table the sharder would never write (a slot held by
// two instances) is left alone and reported.
func TestInvalidTable(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ring, ns := newRing(t, 16)
	table := &v1alpha1.SlotTable{Revision: 3, Instances: []v1alpha1.SlotHolder{{Name: "a", Granted: "0-3"}, {Name: "b", Granted: "3-5"}}}
	patch := client.RawPatch(types.MergePatchType, mustJSON(map[string]any{"status": map[string]any{"slots": table}}))
	g.Expect(env().Client.Status().Patch(context.Background(), &v1alpha1.ControllerRing{ObjectMeta: metav1.ObjectMeta{Name: ring.Name}}, patch)).To(Succeed())
	createLease(t, ring.Name, ns, "a", 60)
	createLease(t, ring.Name, ns, "b", 60)
	s := startSharder(t, ring.Name, ns, slottable.Options{})

	g.Eventually(func(g Gomega) {
		events := &corev1.EventList{}
		g.Expect(env().Client.List(context.Background(), events)).To(Succeed())
		g.Expect(events.Items).To(ContainElement(And(
			HaveField("InvolvedObject.UID", ring.UID),
			HaveField("Reason", slottable.ReasonInvalidSlotTable),
		)))
	}).Should(Succeed())
	g.Consistently(func() (*v1alpha1.SlotTable, error) {
		r, err := getRing(ring.Name)
		return r.Status.Slots, err
	}).Should(Equal(table))
	g.Expect(s.successful()).To(BeEmpty())
}

// TestConflict: a table written by someone else between the controller's
// read and its write makes the write fail; the controller decides again on
// the new table, never granting a slot twice.
func TestConflict(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ring, ns := newRing(t, 64)
	for _, id := range []string{"a", "b", "c"} {
		createLease(t, ring.Name, ns, id, 60)
	}
	sh := startSharder(t, ring.Name, ns, slottable.Options{}, func() {
		// Another sharder grants slots 0-9 to b first.
		other := &v1alpha1.SlotTable{Revision: 1, Instances: []v1alpha1.SlotHolder{{Name: "b", Granted: "0-9"}}}
		patch := client.RawPatch(types.MergePatchType, mustJSON(map[string]any{"status": map[string]any{"slots": other}}))
		g.Expect(env().Client.Status().Patch(context.Background(), &v1alpha1.ControllerRing{ObjectMeta: metav1.ObjectMeta{Name: ring.Name}}, patch)).To(Succeed())
	})
	g.Eventually(tableOf(ring)).Should(Satisfy(balanced("a", "b", "c")))
	final := must(tableOf(ring)())
	for slot := range 10 {
		g.Expect(final.Slots[slot].Holder).To(Equal("b"), "slot %d", slot)
	}
	g.Expect(sh.failed()).To(BeNumerically(">=", 1))
	// The record of a write follows its landing.
	g.Eventually(func() int64 { return int64(len(sh.successful()) + 1) }).Should(Equal(final.Revision), "the other writer's revision and the controller's")
}

// TestFence: an instance that does not acknowledge a release within the
// drain timeout is fenced (its Lease taken, annotated), and its slots are
// granted to others one lease duration after the takeover, not before.
func TestFence(t *testing.T) {
	t.Parallel()
	testFence(t, 0)
}

// TestFenceWaitsForTheBoundOnStopping: a fenced instance that promises a
// bound on stopping (sharder.dev/max-stop) may run a cancelled reconcile
// that long after it stopped admitting reconciles: its slots are granted one
// lease duration plus that bound after the takeover.
func TestFenceWaitsForTheBoundOnStopping(t *testing.T) {
	t.Parallel()
	testFence(t, 3*time.Second)
}

// testFence fences instance b, whose Lease lasts 2s and promises a bound on
// stopping of stop (none when 0), and checks when its slots are granted.
func testFence(t *testing.T, stop time.Duration) {
	g := NewWithT(t)
	ring, ns := newRing(t, 64, func(r *v1alpha1.ControllerRing) {
		r.Spec.DrainTimeout = &metav1.Duration{Duration: time.Second}
	})
	createLease(t, ring.Name, ns, "a", 60)
	createLease(t, ring.Name, ns, "b", 2, func(l *coordinationv1.Lease) {
		if stop > 0 {
			l.Annotations = map[string]string{v1alpha1.AnnotationMaxStop: stop.String()}
		}
	})
	stopRenewing := renew(t, ns, "b", 400*time.Millisecond)
	defer stopRenewing()
	s := startSharder(t, ring.Name, ns, slottable.Options{})
	g.Eventually(tableOf(ring)).Should(Satisfy(balanced("a", "b")))

	createLease(t, ring.Name, ns, "c", 60)
	var rev int64
	g.Eventually(func(g Gomega) {
		tbl, err := tableOf(ring)()
		g.Expect(err).NotTo(HaveOccurred())
		h := holdings(tbl)
		g.Expect(h["a"].releasing).To(BeNumerically(">", 0))
		g.Expect(h["b"].releasing).To(BeNumerically(">", 0))
		rev = tbl.Revision
	}).Should(Succeed())
	acknowledge(g, ring, ns, "a", rev)

	g.Eventually(fixture.GetLease(env().Client, ns, "b")).Should(And(
		HaveField("Spec.HolderIdentity", Equal(ptr.To(sharderIdentity))),
		HaveField("Annotations", HaveKeyWithValue(v1alpha1.AnnotationFenced, "true")),
		HaveField("Spec.LeaseDurationSeconds", Equal(ptr.To(int32(4)))),
	))
	taken := must(fixture.GetLease(env().Client, ns, "b")()).Spec.AcquireTime.Time
	g.Eventually(func() float64 { return testutil.ToFloat64(metrics.SlotFencesTotal.WithLabelValues(ring.Name)) }).Should(BeEquivalentTo(1))
	g.Eventually(tableOf(ring)).Should(Satisfy(balanced("a", "c")))
	for _, w := range s.successful() {
		if t, err := slots.FromStatus(64, w.table); err == nil && len(holders(t)) == 2 && holders(t)[0] == "a" && holders(t)[1] == "c" {
			g.Expect(w.at.Sub(taken)).To(BeNumerically(">=", 2*time.Second+stop), "b's slots granted a lease duration and its bound on stopping after the takeover")
			break
		}
	}
}

// renew renews instance id's Lease every period, as the instance does,
// until it is taken from it or the returned function is called.
func renew(t *testing.T, ns, id string, period time.Duration) (stop func()) {
	t.Helper()
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			lease := &coordinationv1.Lease{}
			if err := env().Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: id}, lease); err != nil {
				continue
			}
			if ptr.Deref(lease.Spec.HolderIdentity, "") != id {
				return // lost: the instance stops
			}
			lease.Spec.RenewTime = ptr.To(metav1.NewMicroTime(time.Now()))
			_ = env().Client.Update(context.Background(), lease)
		}
	}()
	var once bool
	stop = func() {
		if !once {
			once = true
			close(done)
			<-stopped
		}
	}
	t.Cleanup(stop)
	return stop
}

// histogramCount is the number of observations of ring's
// sharder_slot_release_duration_seconds.
func histogramCount(g Gomega, ring string) uint64 {
	m := &dto.Metric{}
	obs, err := metrics.SlotReleaseDuration.GetMetricWithLabelValues(ring)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(obs.(prometheus.Histogram).Write(m)).To(Succeed())
	return m.GetHistogram().GetSampleCount()
}
