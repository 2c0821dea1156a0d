package leasecontroller_test

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"
	coordinationv1 "k8s.io/api/coordination/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/instance/leaseholder"
	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/sharder/metrics"
)

// TestCrashedInstanceLifecycle follows the Lease of an instance that stops
// renewing: ready, expired, uncertain, taken by the sharder (dead), orphaned
// and deleted. The sharder runs on a fake clock, stepped to each transition.
func TestCrashedInstanceLifecycle(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	clk := newFakeClock()
	ring, ns := newRing(t)
	s := startSharder(t, clk, ring, ns)
	renewed := clk.Now()
	createLease(t, ring, ns, "crashed", renewed, 1)

	g.Eventually(s.stateOf(ring, "crashed")).Should(Equal(membership.StateReady))
	g.Eventually(getLease(ns, "crashed")).Should(HaveField("Labels", HaveKeyWithValue(v1alpha1.LabelState, "ready")))

	stepTo(g, clk, renewed.Add(time.Second), ns, []string{"crashed"}, func() bool {
		return s.stateOf(ring, "crashed")() == membership.StateExpired
	})
	// The sharder takes the Lease once, for twice its duration.
	stepTo(g, clk, renewed.Add(2*time.Second), ns, []string{"crashed"}, func() bool {
		lease, err := getLease(ns, "crashed")()
		return err == nil && ptr.Deref(lease.Spec.HolderIdentity, "") == sharderIdentity && lease.Labels[v1alpha1.LabelState] == "dead"
	})
	taken, err := getLease(ns, "crashed")()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(taken.Spec.LeaseDurationSeconds).To(HaveValue(BeEquivalentTo(2)))
	g.Expect(taken.Spec.RenewTime.Time).To(BeTemporally(">=", renewed.Add(2*time.Second)),
		"the sharder must not take a Lease before it is uncertain")
	g.Eventually(s.stateOf(ring, "crashed")).Should(Equal(membership.StateDead))

	// Ten (new) lease durations after the takeover the Lease is orphaned and
	// deleted; the member leaves the ring. Not a moment before.
	orphanedAt := taken.Spec.RenewTime.Add(20 * time.Second)
	clk.SetTime(orphanedAt.Add(-time.Millisecond))
	g.Consistently(getLease(ns, "crashed"), 300*time.Millisecond).Should(HaveField("Spec.HolderIdentity", HaveValue(Equal(sharderIdentity))))
	stepTo(g, clk, orphanedAt, ns, []string{"crashed"}, func() bool {
		_, err := getLease(ns, "crashed")()
		return apierrors.IsNotFound(err)
	})
	g.Expect(clk.Now()).To(BeTemporally(">=", orphanedAt))
	g.Eventually(func() bool { _, ok := s.member(ring, "crashed"); return ok }).Should(BeFalse())

	states, _ := s.published.states(ring, "crashed")
	g.Expect(states).To(Or(
		Equal([]membership.State{membership.StateReady, membership.StateExpired, membership.StateUncertain, membership.StateDead, membership.StateOrphaned, ""}),
		Equal([]membership.State{membership.StateReady, membership.StateExpired, membership.StateDead, membership.StateOrphaned, ""}),
		Equal([]membership.State{membership.StateReady, membership.StateExpired, membership.StateUncertain, membership.StateDead, ""}),
		Equal([]membership.State{membership.StateReady, membership.StateExpired, membership.StateDead, ""}),
	), "published states in order")

	g.Eventually(eventReasons(ns, "crashed")).Should(ContainElements("StateChanged", "InstanceDead"))
	g.Expect(testutil.ToFloat64(metrics.LeaseTakeoversTotal.WithLabelValues(ring))).To(BeEquivalentTo(1))
	g.Expect(testutil.ToFloat64(metrics.LeasesDeletedTotal.WithLabelValues(ring))).To(BeEquivalentTo(1))
	for _, state := range []membership.State{membership.StateReady, membership.StateExpired, membership.StateUncertain, membership.StateDead} {
		g.Expect(testutil.ToFloat64(metrics.LeaseTransitionsTotal.WithLabelValues(ring, string(state)))).To(BeEquivalentTo(1), "entered %s", state)
	}
}

// TestReleasedLeaseIsDeadAtOnce checks that a released Lease is dead at once,
// not after it would have expired. The instance's holder runs on the real
// clock, and so does the sharder.
func TestReleasedLeaseIsDeadAtOnce(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ring, ns := newRing(t)
	s := startSharder(t, clock.RealClock{}, ring, ns)
	holder, err := leaseholder.NewHolder(env().Client, leaseholder.Options{
		Ring: ring, Namespace: ns, Identity: "leaving", LeaseDuration: 2 * time.Second,
	})
	g.Expect(err).NotTo(HaveOccurred())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- holder.Start(ctx) }()
	g.Eventually(s.stateOf(ring, "leaving")).Should(Equal(membership.StateReady))

	before, err := getLease(ns, "leaving")()
	g.Expect(err).NotTo(HaveOccurred())
	cancel()
	g.Eventually(done).Should(Receive(BeNil()))
	released, err := getLease(ns, "leaving")()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(released.Spec.HolderIdentity).To(HaveValue(BeEmpty()))

	g.Eventually(s.stateOf(ring, "leaving")).Should(Equal(membership.StateDead))
	dead, ok := s.published.firstTime(ring, "leaving", membership.StateDead)
	g.Expect(ok).To(BeTrue())
	g.Expect(dead).To(BeTemporally("<", before.Spec.RenewTime.Add(2*time.Second)), "dead before the Lease would have expired")
	g.Eventually(getLease(ns, "leaving")).Should(HaveField("Labels", HaveKeyWithValue(v1alpha1.LabelState, "dead")))
	// The sharder does not take a released Lease.
	g.Consistently(getLease(ns, "leaving"), 3*time.Second).Should(HaveField("Spec.HolderIdentity", HaveValue(BeEmpty())))
}

// TestInstanceReturns checks that an instance coming back is ready again:
// after it expired, and after the sharder took its Lease (once the sharder's
// hold expired). The instances' holders run on the real clock, and so does
// the sharder.
func TestInstanceReturns(t *testing.T) {
	t.Parallel()
	ring, ns := newRing(t)
	s := startSharder(t, clock.RealClock{}, ring, ns)

	start := func(t *testing.T, id string) *leaseholder.Holder {
		g := NewWithT(t)
		holder, err := leaseholder.NewHolder(env().Client, leaseholder.Options{
			Ring: ring, Namespace: ns, Identity: id, LeaseDuration: time.Second, RenewPeriod: 200 * time.Millisecond,
			OnLost: func() { t.Errorf("instance %s lost its Lease", id) },
		})
		g.Expect(err).NotTo(HaveOccurred())
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- holder.Start(ctx) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("holder %s: %v", id, err)
			}
		})
		return holder
	}

	t.Run("after expiring", func(t *testing.T) {
		g := NewWithT(t)
		createLease(t, ring, ns, "back-expired", time.Now(), 1)
		g.Eventually(s.stateOf(ring, "back-expired"), 3*time.Second, 20*time.Millisecond).Should(Equal(membership.StateExpired))
		start(t, "back-expired")
		g.Eventually(s.stateOf(ring, "back-expired")).Should(Equal(membership.StateReady))
		g.Eventually(getLease(ns, "back-expired")).Should(HaveField("Labels", HaveKeyWithValue(v1alpha1.LabelState, "ready")))
		lease, err := getLease(ns, "back-expired")()
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(lease.Spec.HolderIdentity).To(HaveValue(Equal("back-expired")))
	})

	t.Run("after the sharder took its Lease", func(t *testing.T) {
		g := NewWithT(t)
		createLease(t, ring, ns, "back-taken", time.Now(), 1)
		g.Eventually(getLease(ns, "back-taken"), 10*time.Second, 20*time.Millisecond).
			Should(HaveField("Spec.HolderIdentity", HaveValue(Equal(sharderIdentity))))
		taken, err := getLease(ns, "back-taken")()
		g.Expect(err).NotTo(HaveOccurred())
		holder := start(t, "back-taken")
		// The instance waits for the sharder's hold (2 s) to expire.
		g.Eventually(holder.Held, 5*time.Second, 20*time.Millisecond).Should(BeTrue())
		g.Expect(time.Now()).To(BeTemporally(">=", taken.Spec.RenewTime.Add(2*time.Second)))
		g.Eventually(s.stateOf(ring, "back-taken")).Should(Equal(membership.StateReady))
		lease, err := getLease(ns, "back-taken")()
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(lease.Spec.HolderIdentity).To(HaveValue(Equal("back-taken")))
		g.Expect(lease.Spec.LeaseDurationSeconds).To(HaveValue(BeEquivalentTo(1)))
		g.Expect(lease.Spec.LeaseTransitions).To(HaveValue(BeEquivalentTo(2)), "instance -> sharder -> instance")
	})
}

// TestMalformedLeases checks that malformed Leases get their documented state
// and never keep the others out of the ring.
func TestMalformedLeases(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	clk := newFakeClock()
	ring, ns := newRing(t)
	s := startSharder(t, clk, ring, ns)
	now := clk.Now()
	createLease(t, ring, ns, "weighted", now, 60, func(l *coordinationv1.Lease) { l.Labels[v1alpha1.LabelVirtualNodes] = "300" })
	createLease(t, ring, ns, "not-a-number", now, 60, func(l *coordinationv1.Lease) { l.Labels[v1alpha1.LabelVirtualNodes] = "many" })
	createLease(t, ring, ns, "zero", now, 60, func(l *coordinationv1.Lease) { l.Labels[v1alpha1.LabelVirtualNodes] = "0" })
	createLease(t, ring, ns, "stop-soon", now, 60, func(l *coordinationv1.Lease) {
		l.Annotations = map[string]string{v1alpha1.AnnotationMaxStop: "soon"}
	})
	createLease(t, ring, ns, "stop-5s", now, 60, func(l *coordinationv1.Lease) {
		l.Annotations = map[string]string{v1alpha1.AnnotationMaxStop: "5s"}
	})
	createLease(t, ring, ns, "no-holder", now, 60, func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = nil })
	createLease(t, ring, ns, "no-duration", now, 60, func(l *coordinationv1.Lease) { l.Spec.LeaseDurationSeconds = nil })
	createLease(t, ring, ns, "no-times", now, 60, func(l *coordinationv1.Lease) {
		l.Spec.RenewTime = nil
		l.Spec.AcquireTime = nil
	})

	g.Eventually(func() []membership.Member { return s.registry.Members(ring) }).Should(Equal([]membership.Member{
		{ID: "no-duration", State: membership.StateReady}, // the default duration, 15 s
		{ID: "no-holder", State: membership.StateDead},
		{ID: "no-times", State: membership.StateReady}, // renewed at creation
		{ID: "not-a-number", VirtualNodes: 0, State: membership.StateReady},
		{ID: "stop-5s", State: membership.StateReady, MaxStop: 5 * time.Second},
		{ID: "stop-soon", State: membership.StateReady}, // a malformed bound is no promise
		{ID: "weighted", VirtualNodes: 300, State: membership.StateReady},
		{ID: "zero", VirtualNodes: 0, State: membership.StateReady},
	}))
	g.Eventually(eventReasons(ns, "not-a-number")).Should(ContainElement("InvalidVirtualNodes"))
	g.Eventually(eventReasons(ns, "zero")).Should(ContainElement("InvalidVirtualNodes"))
	g.Consistently(eventReasons(ns, "weighted"), time.Second).ShouldNot(ContainElement("InvalidVirtualNodes"))
	g.Eventually(eventReasons(ns, "stop-soon")).Should(ContainElement("InvalidMaxStop"))
	g.Consistently(eventReasons(ns, "stop-5s"), time.Second).ShouldNot(ContainElement("InvalidMaxStop"))

	// Fixing the label gives the weight.
	fixed, err := getLease(ns, "not-a-number")()
	g.Expect(err).NotTo(HaveOccurred())
	fixed.Labels[v1alpha1.LabelVirtualNodes] = "64"
	g.Expect(env().Client.Update(context.Background(), fixed)).To(Succeed())
	g.Eventually(func() membership.Member { m, _ := s.member(ring, "not-a-number"); return m }).
		Should(Equal(membership.Member{ID: "not-a-number", VirtualNodes: 64, State: membership.StateReady}))
}

// TestCacheHoldsOnlyRingLeases checks that Leases without the ring label never
// enter the sharder's cache.
func TestCacheHoldsOnlyRingLeases(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	clk := newFakeClock()
	ring, ns := newRing(t)
	s := startSharder(t, clk, ring, ns)
	createLease(t, ring, ns, "other", clk.Now(), 60, func(l *coordinationv1.Lease) { delete(l.Labels, v1alpha1.LabelRing) })
	createLease(t, ring, ns, "member", clk.Now(), 60)
	g.Eventually(func() error {
		return s.cache.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "member"}, &coordinationv1.Lease{})
	}).Should(Succeed())
	err := s.cache.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "other"}, &coordinationv1.Lease{})
	g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "got %v", err)

	cached := &coordinationv1.LeaseList{}
	g.Expect(s.cache.List(context.Background(), cached)).To(Succeed())
	for _, l := range cached.Items {
		g.Expect(l.Labels).To(HaveKey(v1alpha1.LabelRing), "cached Lease %s/%s", l.Namespace, l.Name)
	}
	// The unlabelled Lease is left alone.
	g.Consistently(getLease(ns, "other"), time.Second).Should(HaveField("Labels", Not(HaveKey(v1alpha1.LabelState))))
}

// TestLeaseNamespace checks that only Leases in the ring's leaseNamespace are
// members, that changing it moves the membership (holding the instances left
// behind as vanished), and that deleting the ring empties it.
func TestLeaseNamespace(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ctx := context.Background()
	clk := newFakeClock()
	ring, ns := newRing(t)
	elsewhere := env().Namespace(t)
	s := startSharder(t, clk, ring, ns, elsewhere)
	createLease(t, ring, ns, "inside", clk.Now(), 60)
	createLease(t, ring, elsewhere, "outside", clk.Now(), 60)

	g.Eventually(func() []membership.Member { return s.registry.Members(ring) }).
		Should(Equal([]membership.Member{{ID: "inside", State: membership.StateReady}}))
	g.Eventually(getLease(ns, "inside")).Should(HaveField("Labels", HaveKeyWithValue(v1alpha1.LabelState, "ready")))
	g.Consistently(getLease(elsewhere, "outside"), time.Second).Should(HaveField("Labels", Not(HaveKey(v1alpha1.LabelState))))

	obj := &v1alpha1.ControllerRing{}
	g.Expect(env().Client.Get(ctx, client.ObjectKey{Name: ring}, obj)).To(Succeed())
	obj.Spec.LeaseNamespace = elsewhere
	g.Expect(env().Client.Update(ctx, obj)).To(Succeed())
	// The instance left behind is not proven gone: it is held as vanished
	// (for twice its 60 s lease duration) while the new namespace's
	// instance is ready.
	g.Eventually(func() []membership.Member { return s.registry.Members(ring) }).
		Should(Equal([]membership.Member{{ID: "inside", State: membership.StateVanished}, {ID: "outside", State: membership.StateReady}}))
	g.Eventually(getLease(elsewhere, "outside")).Should(HaveField("Labels", HaveKeyWithValue(v1alpha1.LabelState, "ready")))
	g.Eventually(getLease(ns, "inside")).Should(HaveField("Labels", Not(HaveKey(v1alpha1.LabelState))))

	g.Expect(env().Client.Delete(ctx, obj)).To(Succeed())
	g.Eventually(func() []membership.Member { return s.registry.Members(ring) }).Should(BeEmpty())
	g.Expect(s.registry.Rings()).NotTo(ContainElement(ring))
}

// TestStateChangeEventsKeepTheirNotes: every state change of one Lease is
// an event with its own note, written within seconds of the change, also
// when the same reason and type recur (ready, then dead, are both Normal
// StateChanged events on the Lease).
func TestStateChangeEventsKeepTheirNotes(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	clk := newFakeClock()
	ring, ns := newRing(t)
	startSharder(t, clk, ring, ns)
	renewed := clk.Now()
	createLease(t, ring, ns, "flaky", renewed, 1)

	notes := eventNotes(ns, "flaky")
	labelled := func(state string) func() bool {
		return func() bool {
			lease, err := getLease(ns, "flaky")()
			return err == nil && lease.Labels[v1alpha1.LabelState] == state
		}
	}
	g.Eventually(labelled("ready")).Should(BeTrue())
	g.Eventually(notes, 5*time.Second, 50*time.Millisecond).Should(ContainElement(`StateChanged: Instance flaky is ready (was "")`))
	stepTo(g, clk, renewed.Add(time.Second), ns, []string{"flaky"}, labelled("expired"))
	stepTo(g, clk, renewed.Add(2*time.Second), ns, []string{"flaky"}, labelled("dead"))
	g.Eventually(notes, 5*time.Second, 50*time.Millisecond).Should(ContainElements(
		`StateChanged: Instance flaky is ready (was "")`,
		`StateChanged: Instance flaky is expired (was "ready")`,
		MatchRegexp(`^StateChanged: Instance flaky is dead \(was "(expired|uncertain)"\)$`),
		"InstanceDead: Instance flaky of ring "+ring+" did not renew its Lease for twice its duration; the sharder took the Lease",
	))
}

// TestLeaseDeletedEventsKeepTheirNotes: two orphaned Leases of one ring are
// deleted at about the same time; the ring gets one LeaseDeleted event per
// Lease, each naming its own, within seconds (events.k8s.io series folded
// the second into the first, whose note it kept).
func TestLeaseDeletedEventsKeepTheirNotes(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	clk := newFakeClock()
	ring, ns := newRing(t)
	s := startSharder(t, clk, ring, ns)
	renewed := clk.Now()
	createLease(t, ring, ns, "first", renewed, 1)
	createLease(t, ring, ns, "second", renewed, 1)
	names := []string{"first", "second"}
	for _, name := range names {
		g.Eventually(s.stateOf(ring, name)).Should(Equal(membership.StateReady), name)
	}

	// Both are taken two durations after their last renewal, and deleted
	// ten (new) durations after that. The dead label is written once the
	// controller has recorded the takeover: the clock steps on only then.
	var takenAt time.Time
	stepTo(g, clk, renewed.Add(2*time.Second), ns, names, func() bool {
		for _, name := range names {
			lease, err := getLease(ns, name)()
			if err != nil || ptr.Deref(lease.Spec.HolderIdentity, "") != sharderIdentity || lease.Labels[v1alpha1.LabelState] != "dead" {
				return false
			}
			if lease.Spec.RenewTime.After(takenAt) {
				takenAt = lease.Spec.RenewTime.Time
			}
		}
		return true
	})
	stepTo(g, clk, takenAt.Add(20*time.Second), ns, names, func() bool {
		for _, name := range names {
			if _, err := getLease(ns, name)(); !apierrors.IsNotFound(err) {
				return false
			}
		}
		return true
	})
	g.Eventually(func() ([]string, error) {
		list := &eventsv1.EventList{}
		if err := env().Client.List(context.Background(), list); err != nil {
			return nil, err
		}
		var notes []string
		for _, e := range list.Items {
			if e.Regarding.Kind == "ControllerRing" && e.Regarding.Name == ring {
				notes = append(notes, e.Reason+": "+e.Note)
			}
		}
		return notes, nil
	}, 5*time.Second, 50*time.Millisecond).Should(ContainElements(
		"LeaseDeleted: Deleted Lease "+ns+"/first of instance first: dead for ten lease durations",
		"LeaseDeleted: Deleted Lease "+ns+"/second of instance second: dead for ten lease durations",
	))
}

// eventNotes returns "<reason>: <note>" of every event about a Lease.
func eventNotes(namespace, lease string) func() ([]string, error) {
	return func() ([]string, error) {
		list := &eventsv1.EventList{}
		if err := env().Client.List(context.Background(), list, client.InNamespace(namespace)); err != nil {
			return nil, err
		}
		var notes []string
		for _, e := range list.Items {
			if e.Regarding.Kind == "Lease" && e.Regarding.Name == lease {
				notes = append(notes, e.Reason+": "+e.Note)
			}
		}
		return notes, nil
	}
}

// eventReasons returns the reasons of the events about a Lease.
func eventReasons(namespace, lease string) func() ([]string, error) {
	return func() ([]string, error) {
		list := &eventsv1.EventList{}
		if err := env().Client.List(context.Background(), list, client.InNamespace(namespace)); err != nil {
			return nil, err
		}
		var reasons []string
		for _, e := range list.Items {
			if e.Regarding.Kind == "Lease" && e.Regarding.Name == lease {
				reasons = append(reasons, e.Reason)
			}
		}
		return reasons, nil
	}
}

// TestUntrustedLeaseContents checks Leases whose contents would otherwise
// keep an instance in a state forever: a renewTime in the future (a skewed
// clock, or anyone who may write Leases) must not keep it ready; a
// leaseTransitions at the largest int32 must not make the takeover fail on
// every retry; a name that is no valid instance ID must never be ready.
func TestUntrustedLeaseContents(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	clk := newFakeClock()
	ring, ns := newRing(t)
	s := startSharder(t, clk, ring, ns)
	seen := clk.Now()
	createLease(t, ring, ns, "future", seen.Add(time.Hour), 1)
	createLease(t, ring, ns, "transitions", seen, 1, func(l *coordinationv1.Lease) {
		l.Spec.LeaseTransitions = ptr.To[int32](math.MaxInt32)
	})
	long := strings.Repeat("x", 64)
	createLease(t, ring, ns, long, seen, 3600)
	for _, id := range []string{"future", "transitions"} {
		g.Eventually(s.stateOf(ring, id)).ShouldNot(BeEmpty(), id)
	}

	// A Lease written an hour ahead and never renewed is taken within
	// about 2 × its one-second duration of being observed, not in an hour.
	stepTo(g, clk, seen.Add(2*time.Second), ns, []string{"future", "transitions"}, func() bool {
		for _, id := range []string{"future", "transitions"} {
			lease, err := getLease(ns, id)()
			if err != nil || lease.Labels[v1alpha1.LabelState] != "dead" {
				return false
			}
		}
		return true
	})
	g.Expect(getLease(ns, "future")()).To(And(
		HaveField("Spec.HolderIdentity", HaveValue(Equal(sharderIdentity))),
		HaveField("Labels", HaveKeyWithValue(v1alpha1.LabelState, "dead")),
	))
	g.Expect(getLease(ns, "transitions")()).To(And(
		HaveField("Spec.HolderIdentity", HaveValue(Equal(sharderIdentity))),
		HaveField("Spec.LeaseTransitions", HaveValue(BeEquivalentTo(math.MaxInt32))),
		HaveField("Labels", HaveKeyWithValue(v1alpha1.LabelState, "dead")),
	))
	g.Eventually(func() membership.Member { m, _ := s.member(ring, long); return m }).
		Should(Equal(membership.Member{ID: long, State: membership.StateInvalid}))
	g.Eventually(getLease(ns, long)).Should(HaveField("Labels", HaveKeyWithValue(v1alpha1.LabelState, "invalid")))
	g.Eventually(eventReasons(ns, long)).Should(ContainElement("InvalidInstanceID"))
}

// renewFor renews instance Lease id every third of d for four lease
// durations of clk, as a live instance does, stamping renewTime with
// stamp. Before each step of the clock the sharder's cache holds the
// renewal; after it, check holds for a moment.
func (s *sharder) renewFor(g Gomega, clk *clocktesting.FakeClock, ns, id string, d time.Duration, stamp func() time.Time, check func(g Gomega)) {
	for range 12 {
		at := stamp()
		g.Eventually(func() error {
			lease, err := getLease(ns, id)()
			if err != nil {
				return err
			}
			lease.Spec.RenewTime = ptr.To(metav1.NewMicroTime(at))
			return env().Client.Update(context.Background(), lease)
		}).Should(Succeed())
		g.Eventually(func() (time.Time, error) {
			cached := &coordinationv1.Lease{}
			err := s.cache.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: id}, cached)
			return ptr.Deref(cached.Spec.RenewTime, metav1.MicroTime{}).Time, err
		}).Should(BeTemporally("==", at.Truncate(time.Microsecond)))
		clk.Step(d / 3)
		g.Consistently(check, 100*time.Millisecond, 20*time.Millisecond).Should(Succeed())
	}
}

// TestSkewedClocksTakeNoLiveLease checks that no clock decides: an instance
// whose clock lags two and a half lease durations, renewing on time, stays
// ready and is never taken; and a sharder whose wall clock is three lease
// durations ahead of the instances' takes no live Lease either.
func TestSkewedClocksTakeNoLiveLease(t *testing.T) {
	t.Parallel()
	const d = 2 * time.Second
	t.Run("instance clock lags 2.5d", func(t *testing.T) {
		t.Parallel()
		g := NewWithT(t)
		clk := newFakeClock()
		ring, ns := newRing(t)
		s := startSharder(t, clk, ring, ns)
		lag := func() time.Time { return clk.Now().Add(-5 * d / 2) }
		createLease(t, ring, ns, "lagging", lag(), int32(d/time.Second))
		g.Eventually(s.stateOf(ring, "lagging")).Should(Equal(membership.StateReady))
		s.renewFor(g, clk, ns, "lagging", d, lag, func(g Gomega) {
			g.Expect(s.stateOf(ring, "lagging")()).To(Equal(membership.StateReady))
			g.Expect(getLease(ns, "lagging")()).To(HaveField("Spec.HolderIdentity", HaveValue(Equal("lagging"))))
		})
	})
	t.Run("sharder clock ahead by 3d", func(t *testing.T) {
		t.Parallel()
		g := NewWithT(t)
		// The sharder's clock runs 3d ahead of the instance's.
		clk := clocktesting.NewFakeClock(time.Now().Add(3 * d).Truncate(time.Microsecond))
		instanceNow := func() time.Time { return clk.Now().Add(-3 * d) }
		ring, ns := newRing(t)
		s := startSharderAs(t, "sharder:ahead", clk, ring, ns)

		createLease(t, ring, ns, "live", instanceNow(), int32(d/time.Second))
		g.Eventually(func() []membership.Member { return s.registry.Members(ring) }).Should(ContainElement(HaveField("State", membership.StateReady)))
		s.renewFor(g, clk, ns, "live", d, instanceNow, func(g Gomega) {
			g.Expect(s.registry.Members(ring)).To(ConsistOf(membership.Member{ID: "live", State: membership.StateReady}))
			g.Expect(getLease(ns, "live")()).To(HaveField("Spec.HolderIdentity", HaveValue(Equal("live"))))
		})
	})
}
