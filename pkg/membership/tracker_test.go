package membership

import (
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/utils/ptr"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// TestTrackerFutureRenewTime checks that a renewTime in the future cannot
// keep an instance ready: the renewal counts from when it was observed.
func TestTrackerFutureRenewTime(t *testing.T) {
	g := NewWithT(t)
	var tr Tracker
	lease := instanceLease("a", "a", epoch.Add(24*time.Hour), 10)

	m, next := tr.Observe("r", 0, lease, epoch)
	g.Expect(m.State).To(Equal(StateReady))
	g.Expect(next).To(Equal(epoch.Add(10 * time.Second)))
	// StateOf alone trusts the Lease for a day.
	state, _ := StateOf(lease, epoch.Add(time.Hour))
	g.Expect(state).To(Equal(StateReady))

	m, next = tr.Observe("r", 0, lease, epoch.Add(10*time.Second))
	g.Expect(m.State).To(Equal(StateExpired))
	g.Expect(next).To(Equal(epoch.Add(20 * time.Second)))
	m, _ = tr.Observe("r", 0, lease, epoch.Add(time.Hour))
	g.Expect(m.State).To(Equal(StateUncertain))

	// A new renewal (a changed renewTime) counts from its observation.
	lease.Spec.RenewTime.Time = epoch.Add(48 * time.Hour)
	m, next = tr.Observe("r", 0, lease, epoch.Add(2*time.Hour))
	g.Expect(m.State).To(Equal(StateReady))
	g.Expect(next).To(Equal(epoch.Add(2*time.Hour + 10*time.Second)))
}

// TestTrackerPastRenewTime checks that a Lease already old when first
// observed counts as renewed when it was observed: no time written on a
// Lease decides, so a new sharder leader starts with every Lease as
// observed now.
func TestTrackerPastRenewTime(t *testing.T) {
	g := NewWithT(t)
	var tr Tracker
	m, next := tr.Observe("r", 0, instanceLease("a", "a", epoch, 10), epoch.Add(25*time.Second))
	g.Expect(m.State).To(Equal(StateReady))
	g.Expect(next).To(Equal(epoch.Add(35 * time.Second)))
	m, _ = tr.Observe("r", 0, instanceLease("a", "a", epoch, 10), epoch.Add(40*time.Second))
	g.Expect(m.State).To(Equal(StateExpired))
	m, _ = tr.Observe("r", 0, instanceLease("a", "a", epoch, 10), epoch.Add(45*time.Second))
	g.Expect(m.State).To(Equal(StateUncertain))
}

// TestTrackerSkewedInstanceClock checks that an instance whose clock lags
// two and a half lease durations, renewing on time, stays ready, and that
// one whose clock runs ahead gains nothing: only the tracker's own clock
// times renewals.
func TestTrackerSkewedInstanceClock(t *testing.T) {
	g := NewWithT(t)
	var tr Tracker
	const d = 10 * time.Second
	for _, skew := range []time.Duration{-25 * time.Second, 25 * time.Second, -time.Hour, time.Hour} {
		id := "lag"
		if skew > 0 {
			id = "ahead"
		}
		for i := range 30 {
			now := epoch.Add(time.Duration(i) * d / 3)
			m, _ := tr.Observe("r"+skew.String(), 0, instanceLease(id, id, now.Add(skew), 10), now)
			g.Expect(m.State).To(Equal(StateReady), "skew %v, renewal %d", skew, i)
		}
		// It stops renewing: expired d after the last renewal was seen,
		// whatever its clock wrote.
		last := epoch.Add(29 * d / 3)
		l := instanceLease(id, id, last.Add(skew), 10)
		m, _ := tr.Observe("r"+skew.String(), 0, l, last.Add(d-time.Millisecond))
		g.Expect(m.State).To(Equal(StateReady))
		m, _ = tr.Observe("r"+skew.String(), 0, l, last.Add(d))
		g.Expect(m.State).To(Equal(StateExpired), "skew %v", skew)
		m, _ = tr.Observe("r"+skew.String(), 0, l, last.Add(2*d))
		g.Expect(m.State).To(Equal(StateUncertain), "skew %v", skew)
	}
}

// TestTrackerRestarting checks the restart hold: a Lease handed back for a
// restart keeps its instance restarting (objects stay, none are added) for
// the ring's restart hold after the tracker saw it, then dead; a restart
// hold of 0 makes it dead at once; the instance acquiring the Lease again
// makes it ready.
func TestTrackerRestarting(t *testing.T) {
	g := NewWithT(t)
	var tr Tracker
	restarting := instanceLease("a", "", epoch, 10)
	restarting.Annotations = map[string]string{"sharder.dev/restarting": "true"}
	m, next := tr.Observe("r", 30*time.Second, restarting, epoch.Add(time.Second))
	g.Expect(m.State).To(Equal(StateRestarting))
	g.Expect(m.Movable).To(BeFalse())
	g.Expect(next).To(Equal(epoch.Add(31 * time.Second)))
	m, _ = tr.Observe("r", 30*time.Second, restarting, epoch.Add(31*time.Second))
	g.Expect(m.State).To(Equal(StateDead))
	g.Expect(m.Movable).To(BeFalse(), "a released Lease is not held by the sharder")

	m, _ = tr.Observe("off", 0, restarting, epoch)
	g.Expect(m.State).To(Equal(StateDead))

	back := instanceLease("a", "a", epoch.Add(5*time.Second), 10)
	m, _ = tr.Observe("r", 30*time.Second, back, epoch.Add(32*time.Second))
	g.Expect(m.State).To(Equal(StateReady))

	// Released without the annotation: dead at once.
	m, _ = tr.Observe("r", 30*time.Second, instanceLease("b", "", epoch, 10), epoch)
	g.Expect(m.State).To(Equal(StateDead))
}

// TestTrackerHold checks when a dead instance's objects may move: only
// while the sharder's recorded hold lasts (two thirds of the duration it
// wrote), never for a released Lease or another sharder's hold; always for
// a Lease taken by somebody else and for a vanished instance, which have
// no Lease for the sharder to hold.
func TestTrackerHold(t *testing.T) {
	g := NewWithT(t)
	var tr Tracker
	released := instanceLease("a", "", epoch, 10)
	m, _ := tr.Observe("r", 0, released, epoch)
	g.Expect(m).To(Equal(Member{ID: "a", State: StateDead}))

	oldLeader := instanceLease("a", "sharder:old", epoch, 10)
	m, _ = tr.Observe("r", 0, oldLeader, epoch.Add(time.Second))
	g.Expect(m.Movable).To(BeFalse(), "another sharder's hold may lapse at any time")

	held := instanceLease("a", "sharder:me", epoch.Add(time.Hour), 10) // a wall clock ahead changes nothing
	tr.Hold("r", "a", epoch.Add(2*time.Second), 10*time.Second)
	g.Expect(tr.HeldAt("r", "a")).To(Equal(epoch.Add(2 * time.Second)))
	// The cache may still deliver the version before the hold.
	m, next := tr.Observe("r", 0, released, epoch.Add(3*time.Second))
	g.Expect(m.Movable).To(BeTrue())
	g.Expect(next).To(Equal(epoch.Add(2*time.Second + 10*time.Second*2/3)))
	m, _ = tr.Observe("r", 0, held, epoch.Add(4*time.Second))
	g.Expect(m.Movable).To(BeTrue())
	m, _ = tr.Observe("r", 0, held, epoch.Add(2*time.Second+10*time.Second*2/3))
	g.Expect(m.Movable).To(BeFalse(), "a hold not renewed within two thirds of its duration")

	tr.Hold("r", "a", epoch.Add(9*time.Second), 10*time.Second)
	m, _ = tr.Observe("r", 0, held, epoch.Add(10*time.Second))
	g.Expect(m.Movable).To(BeTrue())
	tr.Unhold("r", "a")
	m, _ = tr.Observe("r", 0, held, epoch.Add(10*time.Second))
	g.Expect(m.Movable).To(BeFalse())
	g.Expect(tr.HeldAt("r", "a").IsZero()).To(BeTrue())

	// The instance holds its Lease again: the hold is over for good.
	tr.Hold("r", "a", epoch.Add(11*time.Second), 10*time.Second)
	m, _ = tr.Observe("r", 0, instanceLease("a", "a", epoch, 10), epoch.Add(12*time.Second))
	g.Expect(m).To(Equal(Member{ID: "a", State: StateReady}))
	m, _ = tr.Observe("r", 0, released, epoch.Add(13*time.Second))
	g.Expect(m.Movable).To(BeFalse())

	m, _ = tr.Observe("r", 0, instanceLease("b", "someone-else", epoch, 10), epoch)
	g.Expect(m).To(Equal(Member{ID: "b", State: StateDead}), "taken by somebody else: moves only under the sharder's hold")
}

// TestTrackerHoldMargin: with a margin for moves in flight, the objects
// stop being movable that long before the instance could take its Lease
// back (the hold write's start + d), but never sooner than d/3 after it.
func TestTrackerHoldMargin(t *testing.T) {
	for _, c := range []struct {
		d, margin, want time.Duration
	}{
		{15 * time.Second, 2 * time.Second, 10 * time.Second}, // 2d/3 leaves more than the margin
		{3 * time.Second, 2 * time.Second, time.Second},       // d − margin
		{4500 * time.Millisecond, 2 * time.Second, 2500 * time.Millisecond},
		{time.Second, 2 * time.Second, time.Second / 3}, // shorter than the margin: d/3
		{3 * time.Second, 0, 2 * time.Second},           // no margin: 2d/3
	} {
		tr := Tracker{WriteTimeout: c.margin}
		if got := tr.MovableFor(c.d); got != c.want {
			t.Errorf("d %s, margin %s: movable for %s, want %s", c.d, c.margin, got, c.want)
		}
		tr.Hold("r", "a", epoch, c.d)
		held := instanceLease("a", "sharder:me", epoch, int32(c.d/time.Second))
		if m, _ := tr.Observe("r", 0, held, epoch.Add(c.want-time.Millisecond)); !m.Movable {
			t.Errorf("d %s, margin %s: not movable just before %s", c.d, c.margin, c.want)
		}
		if m, _ := tr.Observe("r", 0, held, epoch.Add(c.want)); m.Movable {
			t.Errorf("d %s, margin %s: still movable at %s", c.d, c.margin, c.want)
		}
	}
}

// TestTrackerVanished walks instances whose Leases disappear from the ring
// through the states the tracker gives them.
func TestTrackerVanished(t *testing.T) {
	g := NewWithT(t)
	var tr Tracker
	ready := *instanceLease("ready", "ready", epoch, 10)
	expired := *instanceLease("expired", "expired", epoch.Add(-15*time.Second), 10)
	uncertain := *instanceLease("uncertain", "uncertain", epoch.Add(-25*time.Second), 10)
	released := *instanceLease("released", "", epoch, 10)
	weighted := *instanceLease("weighted", "weighted", epoch, 10)
	weighted.Labels["sharder.dev/virtual-nodes"] = "7"
	all := []coordinationv1.Lease{ready, expired, uncertain, released, weighted}
	// The tracker saw the last renewals of two of them some time ago.
	tr.Observe("r", 0, &expired, epoch.Add(-15*time.Second))
	tr.Observe("r", 0, &uncertain, epoch.Add(-25*time.Second))

	members, next := tr.Members("r", 0, all, epoch)
	g.Expect(members).To(Equal([]Member{
		{ID: "expired", State: StateExpired}, {ID: "ready", State: StateReady}, {ID: "released", State: StateDead},
		{ID: "uncertain", State: StateUncertain}, {ID: "weighted", VirtualNodes: 7, State: StateReady},
	}))
	g.Expect(next).To(Equal(epoch.Add(5 * time.Second)))

	// Every Lease vanishes at epoch + 1s.
	members, next = tr.Members("r", 0, nil, epoch.Add(time.Second))
	g.Expect(members).To(Equal([]Member{
		{ID: "expired", State: StateVanished}, // held until its t + 2d = epoch + 5s
		{ID: "ready", State: StateVanished},   // held until epoch + 20s
		{ID: "released", State: StateDead},    // proven gone: dead, but moves only under the sharder's hold
		{ID: "uncertain", State: StateDead},   // not renewed for 2d: gone, moves only under the sharder's hold
		{ID: "weighted", VirtualNodes: 7, State: StateVanished},
	}))
	g.Expect(next).To(Equal(epoch.Add(5 * time.Second)))

	members, _ = tr.Members("r", 0, nil, epoch.Add(5*time.Second))
	g.Expect(members).To(ContainElement(Member{ID: "expired", State: StateDead}))
	g.Expect(members).To(ContainElement(Member{ID: "ready", State: StateVanished}))

	members, next = tr.Members("r", 0, nil, epoch.Add(20*time.Second))
	g.Expect(members).To(ContainElement(Member{ID: "ready", State: StateDead}))
	g.Expect(next).To(Equal(epoch.Add(75 * time.Second))) // the dead are forgotten at t + 10d, uncertain's first

	// The sharder created the dead instance's Lease and holds it (the
	// cache does not have it yet): movable for two thirds of the duration.
	tr.Hold("r", "ready", epoch.Add(20*time.Second), 10*time.Second)
	members, next = tr.Members("r", 0, nil, epoch.Add(21*time.Second))
	g.Expect(members).To(ContainElement(Member{ID: "ready", State: StateDead, Movable: true}))
	g.Expect(next).To(Equal(epoch.Add(20*time.Second + 10*time.Second*2/3)))
	members, _ = tr.Members("r", 0, nil, epoch.Add(27*time.Second))
	g.Expect(members).To(ContainElement(Member{ID: "ready", State: StateDead}), "a hold not renewed")

	// An instance that comes back with a new Lease is ready again.
	back := *instanceLease("ready", "ready", epoch.Add(28*time.Second), 10)
	members, _ = tr.Members("r", 0, []coordinationv1.Lease{back}, epoch.Add(28*time.Second))
	g.Expect(members).To(ContainElement(Member{ID: "ready", State: StateReady}))

	members, next = tr.Members("r", 0, nil, epoch.Add(time.Hour))
	g.Expect(members).To(BeEmpty())
	g.Expect(next.IsZero()).To(BeTrue())
}

// TestTrackerRingsApart checks that a Lease that moves to another ring
// vanishes from the first and is a member of the second, and that Forget
// drops a ring.
func TestTrackerRingsApart(t *testing.T) {
	g := NewWithT(t)
	var tr Tracker
	l := *instanceLease("a", "a", epoch, 10)
	members, _ := tr.Members("one", 0, []coordinationv1.Lease{l}, epoch)
	g.Expect(members).To(HaveLen(1))
	l.Labels["sharder.dev/ring"] = "two"
	members, _ = tr.Members("two", 0, []coordinationv1.Lease{l}, epoch.Add(time.Second))
	g.Expect(members).To(Equal([]Member{{ID: "a", State: StateReady}}))
	members, _ = tr.Members("one", 0, nil, epoch.Add(time.Second))
	g.Expect(members).To(Equal([]Member{{ID: "a", State: StateVanished}}))
	tr.Forget("one")
	members, _ = tr.Members("one", 0, nil, epoch.Add(time.Second))
	g.Expect(members).To(BeEmpty())
}

// TestInvalidID checks that instance IDs are valid Lease names and label
// values, and that a Lease with an invalid name never receives objects.
func TestInvalidID(t *testing.T) {
	for id, valid := range map[string]bool{
		"worker-0":              true,
		"a.b":                   true,
		"":                      false,
		"Worker":                false,
		"worker_0":              false,
		strings.Repeat("b", 64): false,
		strings.Repeat("b", 63): true,
	} {
		err := InvalidID(id)
		if (err == nil) != valid {
			t.Errorf("InvalidID(%q) = %v, want valid=%v", id, err, valid)
		}
	}
	long := strings.Repeat("x", 64)
	lease := instanceLease(long, long, epoch, 10)
	if state, next := StateOf(lease, epoch); state != StateInvalid || !next.IsZero() {
		t.Errorf("StateOf(64-character name) = %s, %v; want invalid with no next transition", state, next)
	}
	var tr Tracker
	if m, _ := tr.Observe("r", 0, lease, epoch); m.State.Ready() {
		t.Error("an invalid Lease is ready")
	}
}

// TestTrackerReadyAgreesWithObserve checks that Ready, asked without the
// Lease, gives Observe's verdict at every time of a Lease's life, and that a
// Lease that left the ring is not ready from the moment Vanish records it.
func TestTrackerReadyAgreesWithObserve(t *testing.T) {
	g := NewWithT(t)
	var tr Tracker
	leases := map[string]*coordinationv1.Lease{
		"held":     instanceLease("held", "held", epoch, 10),
		"released": instanceLease("released", "", epoch, 10),
		"taken":    instanceLease("taken", "sharder:x", epoch, 10),
		"restarting": func() *coordinationv1.Lease {
			l := instanceLease("restarting", "", epoch, 10)
			l.Annotations = map[string]string{v1alpha1.AnnotationRestarting: "true"}
			return l
		}(),
		strings.Repeat("x", 64): instanceLease(strings.Repeat("x", 64), strings.Repeat("x", 64), epoch, 10),
	}
	for id, lease := range leases {
		tr.Observe("r", 30*time.Second, lease, epoch)
		for _, after := range []time.Duration{0, 9 * time.Second, 10 * time.Second, 25 * time.Second, time.Hour} {
			now := epoch.Add(after)
			g.Expect(tr.Ready("r", id, now)).To(Equal(func() bool {
				var probe Tracker
				probe.Observe("r", 30*time.Second, lease, epoch)
				m, _ := probe.Observe("r", 30*time.Second, lease, now)
				return m.State.Ready()
			}()), "%s at +%v", id, after)
		}
	}
	g.Expect(tr.Ready("r", "unknown", epoch)).To(BeFalse())
	g.Expect(tr.Ready("other", "held", epoch)).To(BeFalse())

	tr.Vanish("r", "held")
	g.Expect(tr.Ready("r", "held", epoch)).To(BeFalse())
	members, _ := tr.Members("r", 0, nil, epoch)
	g.Expect(members).To(ContainElement(HaveField("ID", "held")))
	for _, m := range members {
		if m.ID == "held" {
			g.Expect(m.State).To(Equal(StateVanished))
		}
	}
	// Back in the ring: ready again, as observed.
	tr.Observe("r", 0, leases["held"], epoch)
	g.Expect(tr.Ready("r", "held", epoch)).To(BeTrue())
	// Missing from the Leases Members is given: not ready either.
	tr.Members("r", 0, nil, epoch)
	g.Expect(tr.Ready("r", "held", epoch)).To(BeFalse())
}

// TestTrackerRenewed checks that Renewed records a renewal of a Lease last
// seen ready and held by its instance, as Observe would, and records
// nothing for any other Lease or change, so that the caller observes those
// fully.
func TestTrackerRenewed(t *testing.T) {
	g := NewWithT(t)
	var tr Tracker
	renew := func(l *coordinationv1.Lease, at time.Time) *coordinationv1.Lease {
		l = l.DeepCopy()
		l.Spec.RenewTime.Time = at
		return l
	}
	held := instanceLease("held", "held", epoch, 10)
	g.Expect(tr.Renewed("r", held, epoch)).To(BeFalse(), "a Lease the tracker never saw")
	tr.Observe("r", 0, held, epoch)

	// A renewal at +5 s counts from +5 s: ready until +15 s.
	g.Expect(tr.Renewed("r", renew(held, epoch.Add(5*time.Second)), epoch.Add(5*time.Second))).To(BeTrue())
	m, next := tr.Observe("r", 0, renew(held, epoch.Add(5*time.Second)), epoch.Add(14*time.Second))
	g.Expect(m.State).To(Equal(StateReady))
	g.Expect(next).To(Equal(epoch.Add(15 * time.Second)))
	g.Expect(tr.Ready("r", "held", epoch.Add(15*time.Second))).To(BeFalse())

	// Seen expired last: Renewed leaves it to Observe.
	tr.Observe("r", 0, renew(held, epoch.Add(5*time.Second)), epoch.Add(16*time.Second))
	g.Expect(tr.Renewed("r", renew(held, epoch.Add(17*time.Second)), epoch.Add(17*time.Second))).To(BeFalse())
	m, _ = tr.Observe("r", 0, renew(held, epoch.Add(5*time.Second)), epoch.Add(17*time.Second))
	g.Expect(m.State).To(Equal(StateExpired), "Renewed recorded nothing")

	// Another holder or duration is not a renewal.
	fresh := instanceLease("fresh", "fresh", epoch, 10)
	tr.Observe("r", 0, fresh, epoch)
	taken := renew(fresh, epoch.Add(time.Second))
	taken.Spec.HolderIdentity = ptr.To("sharder:x")
	g.Expect(tr.Renewed("r", taken, epoch.Add(time.Second))).To(BeFalse())
	longer := renew(fresh, epoch.Add(time.Second))
	longer.Spec.LeaseDurationSeconds = ptr.To[int32](20)
	g.Expect(tr.Renewed("r", longer, epoch.Add(time.Second))).To(BeFalse())
	g.Expect(tr.Renewed("other", renew(fresh, epoch.Add(time.Second)), epoch.Add(time.Second))).To(BeFalse(), "another ring")
	m, _ = tr.Observe("r", 0, fresh, epoch.Add(11*time.Second))
	g.Expect(m.State).To(Equal(StateExpired), "none of those was recorded")

	// A vanished Lease is not renewed either.
	back := instanceLease("back", "back", epoch, 10)
	tr.Observe("r", 0, back, epoch)
	tr.Vanish("r", "back")
	g.Expect(tr.Renewed("r", renew(back, epoch.Add(time.Second)), epoch.Add(time.Second))).To(BeFalse())
}

// TestTrackerExpect: an instance known only from its objects (no Lease the
// tracker ever saw) is vanished for the hold it is given, then dead, and
// movable only under the sharder's hold; an ID no Lease can have is not
// remembered; Expect leaves known instances alone.
func TestTrackerExpect(t *testing.T) {
	g := NewWithT(t)
	var tr Tracker
	tr.Expect("r", "ghost", 10*time.Second, 4*time.Second, epoch)
	tr.Expect("r", "Not_A_Lease", 10*time.Second, 4*time.Second, epoch)
	members, next := tr.Members("r", 0, nil, epoch.Add(time.Second))
	g.Expect(members).To(Equal([]Member{{ID: "ghost", State: StateVanished}}))
	g.Expect(next).To(Equal(epoch.Add(4 * time.Second)))
	g.Expect(tr.Absent("r", "ghost")).To(BeTrue())
	g.Expect(tr.LastDuration("r", "ghost")).To(Equal(10 * time.Second))

	tr.Expect("r", "ghost", 10*time.Second, time.Hour, epoch.Add(2*time.Second)) // known: unchanged
	members, _ = tr.Members("r", 0, nil, epoch.Add(4*time.Second))
	g.Expect(members).To(Equal([]Member{{ID: "ghost", State: StateDead}}))

	tr.Hold("r", "ghost", epoch.Add(5*time.Second), 10*time.Second)
	members, _ = tr.Members("r", 0, nil, epoch.Add(6*time.Second))
	g.Expect(members).To(Equal([]Member{{ID: "ghost", State: StateDead, Movable: true}}))
}

// TestTrackerForeignHolder: a Lease taken by somebody other than the
// instance and a sharder is dead, but its objects move only once this
// sharder holds it (it takes it as any candidate would).
func TestTrackerForeignHolder(t *testing.T) {
	g := NewWithT(t)
	var tr Tracker
	l := instanceLease("a", "someone-else", epoch, 10)
	m, _ := tr.Observe("r", 0, l, epoch)
	g.Expect(m).To(Equal(Member{ID: "a", State: StateDead}))
	g.Expect(tr.ObservedSince("r", "a")).To(Equal(epoch))
	m, _ = tr.Observe("r", 0, l, epoch.Add(time.Hour))
	g.Expect(m.Movable).To(BeFalse(), "however long nobody renewed it")
	taken := instanceLease("a", "sharder:me", epoch.Add(time.Hour), 10)
	tr.Hold("r", "a", epoch.Add(time.Hour), 10*time.Second)
	m, _ = tr.Observe("r", 0, taken, epoch.Add(time.Hour+time.Second))
	g.Expect(m).To(Equal(Member{ID: "a", State: StateDead, Movable: true}))
}

// TestTrackerBoundOnStopping: an instance that promises a bound on
// stopping (sharder.dev/max-stop) longer than its Lease's duration may run a
// cancelled reconcile until d + that bound after its last renewal: it stays
// expired (held, when it vanished) until then, not only until 2d; a shorter
// bound changes nothing; a malformed one is no promise.
func TestTrackerBoundOnStopping(t *testing.T) {
	g := NewWithT(t)
	promising := func(id, stop string) coordinationv1.Lease {
		l := *instanceLease(id, id, epoch, 10)
		if stop != "" {
			l.Annotations = map[string]string{v1alpha1.AnnotationMaxStop: stop}
		}
		return l
	}
	long, short, malformed := promising("long", "15s"), promising("short", "5s"), promising("malformed", "soon")
	var tr Tracker
	members, _ := tr.Members("r", 0, []coordinationv1.Lease{long, short, malformed}, epoch)
	g.Expect(members).To(Equal([]Member{
		{ID: "long", State: StateReady, MaxStop: 15 * time.Second},
		{ID: "malformed", State: StateReady},
		{ID: "short", State: StateReady, MaxStop: 5 * time.Second},
	}))

	at := func(after time.Duration) map[string]State {
		members, _ := tr.Members("r", 0, []coordinationv1.Lease{long, short, malformed}, epoch.Add(after))
		states := map[string]State{}
		for _, m := range members {
			states[m.ID] = m.State
		}
		return states
	}
	g.Expect(at(20 * time.Second)).To(Equal(map[string]State{"long": StateExpired, "malformed": StateUncertain, "short": StateUncertain}))
	g.Expect(at(25*time.Second - time.Millisecond)).To(HaveKeyWithValue("long", StateExpired))
	g.Expect(at(25 * time.Second)).To(HaveKeyWithValue("long", StateUncertain))
	_, next := StateOf(&long, epoch.Add(15*time.Second))
	g.Expect(next).To(Equal(epoch.Add(25*time.Second)), "the next transition is at d + the bound")

	// Vanished, it is held as long.
	var vanishing Tracker
	vanishing.Members("r", 0, []coordinationv1.Lease{long}, epoch)
	members, next = vanishing.Members("r", 0, nil, epoch.Add(21*time.Second))
	g.Expect(members).To(Equal([]Member{{ID: "long", State: StateVanished, MaxStop: 15 * time.Second}}))
	g.Expect(next).To(Equal(epoch.Add(25 * time.Second)))
	members, _ = vanishing.Members("r", 0, nil, epoch.Add(25*time.Second))
	g.Expect(members).To(Equal([]Member{{ID: "long", State: StateDead, MaxStop: 15 * time.Second}}))
}
