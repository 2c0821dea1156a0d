package membership

import (
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
)

// TestTrackerFutureRenewTime checks that a renewTime in the future cannot
// keep an instance ready: the renewal counts from when it was observed.
func TestTrackerFutureRenewTime(t *testing.T) {
	g := NewWithT(t)
	var tr Tracker
	lease := instanceLease("a", "a", epoch.Add(24*time.Hour), 10)

	m, next := tr.Observe("r", lease, epoch)
	g.Expect(m.State).To(Equal(StateReady))
	g.Expect(next).To(Equal(epoch.Add(10 * time.Second)))
	// StateOf alone trusts the Lease for a day.
	state, _ := StateOf(lease, epoch.Add(time.Hour))
	g.Expect(state).To(Equal(StateReady))

	m, next = tr.Observe("r", lease, epoch.Add(10*time.Second))
	g.Expect(m.State).To(Equal(StateExpired))
	g.Expect(next).To(Equal(epoch.Add(20 * time.Second)))
	m, _ = tr.Observe("r", lease, epoch.Add(time.Hour))
	g.Expect(m.State).To(Equal(StateUncertain))

	// A new renewal (a changed renewTime) counts from its observation.
	lease.Spec.RenewTime.Time = epoch.Add(48 * time.Hour)
	m, next = tr.Observe("r", lease, epoch.Add(2*time.Hour))
	g.Expect(m.State).To(Equal(StateReady))
	g.Expect(next).To(Equal(epoch.Add(2*time.Hour + 10*time.Second)))
}

// TestTrackerPastRenewTime checks that a Lease already old when first
// observed keeps the time written on it: a new observer does not give it a
// fresh lease duration.
func TestTrackerPastRenewTime(t *testing.T) {
	g := NewWithT(t)
	var tr Tracker
	m, _ := tr.Observe("r", instanceLease("a", "a", epoch, 10), epoch.Add(25*time.Second))
	g.Expect(m.State).To(Equal(StateUncertain))
	m, next := tr.Observe("r", instanceLease("b", "b", epoch, 10), epoch.Add(5*time.Second))
	g.Expect(m.State).To(Equal(StateReady))
	g.Expect(next).To(Equal(epoch.Add(10 * time.Second)))
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

	members, next := tr.Members("r", all, epoch)
	g.Expect(members).To(Equal([]Member{
		{ID: "expired", State: StateExpired}, {ID: "ready", State: StateReady}, {ID: "released", State: StateDead},
		{ID: "uncertain", State: StateUncertain}, {ID: "weighted", VirtualNodes: 7, State: StateReady},
	}))
	g.Expect(next).To(Equal(epoch.Add(5 * time.Second)))

	// Every Lease vanishes at epoch + 1s.
	members, next = tr.Members("r", nil, epoch.Add(time.Second))
	g.Expect(members).To(Equal([]Member{
		{ID: "expired", State: StateVanished}, // held until its t + 2d = epoch + 5s
		{ID: "ready", State: StateVanished},   // held until epoch + 20s
		{ID: "released", State: StateDead},    // proven gone: stays dead
		{ID: "uncertain", State: StateDead},   // not renewed for 2d: gone
		{ID: "weighted", VirtualNodes: 7, State: StateVanished},
	}))
	g.Expect(next).To(Equal(epoch.Add(5 * time.Second)))

	members, _ = tr.Members("r", nil, epoch.Add(5*time.Second))
	g.Expect(members).To(ContainElement(Member{ID: "expired", State: StateDead}))
	g.Expect(members).To(ContainElement(Member{ID: "ready", State: StateVanished}))

	members, next = tr.Members("r", nil, epoch.Add(20*time.Second))
	g.Expect(members).To(ContainElement(Member{ID: "ready", State: StateDead}))
	g.Expect(next).To(Equal(epoch.Add(75 * time.Second))) // the dead are forgotten at t + 10d, uncertain's first

	// An instance that comes back with a new Lease is ready again.
	back := *instanceLease("ready", "ready", epoch.Add(21*time.Second), 10)
	members, _ = tr.Members("r", []coordinationv1.Lease{back}, epoch.Add(21*time.Second))
	g.Expect(members).To(ContainElement(Member{ID: "ready", State: StateReady}))

	members, next = tr.Members("r", nil, epoch.Add(time.Hour))
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
	members, _ := tr.Members("one", []coordinationv1.Lease{l}, epoch)
	g.Expect(members).To(HaveLen(1))
	l.Labels["sharder.dev/ring"] = "two"
	members, _ = tr.Members("two", []coordinationv1.Lease{l}, epoch.Add(time.Second))
	g.Expect(members).To(Equal([]Member{{ID: "a", State: StateReady}}))
	members, _ = tr.Members("one", nil, epoch.Add(time.Second))
	g.Expect(members).To(Equal([]Member{{ID: "a", State: StateVanished}}))
	tr.Forget("one")
	members, _ = tr.Members("one", nil, epoch.Add(time.Second))
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
	if m, _ := tr.Observe("r", lease, epoch); m.State.Ready() {
		t.Error("an invalid Lease is ready")
	}
}
