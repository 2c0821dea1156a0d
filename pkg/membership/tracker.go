package membership

import (
	"slices"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/utils/ptr"
)

// Tracker computes the members of rings from their Leases as one observer
// (the sharder, or a webhook replica) sees them over time. It differs from
// StateOf in two ways, both of which keep an instance that may still be
// working from being counted as gone, or a stale Lease from being counted as
// ready:
//
//   - A renewal counts from when the tracker first observed it, or from the
//     time written on the Lease if that is earlier. A renewTime in the
//     future (a skewed clock, or anyone who may write Leases in the
//     namespace) therefore cannot keep an instance ready: the Lease expires
//     one lease duration after the tracker saw it last change. This is how
//     client-go's leader election measures expiry, except that a Lease
//     already old when first observed is not given a fresh lease duration.
//   - An instance whose Lease disappears from its ring (deleted, its
//     sharder.dev/ring label changed, or the ring's leaseNamespace changed)
//     without having been released or taken is not proven gone. It stays a
//     member in StateVanished, holding its objects, until twice its last
//     seen lease duration has passed since its last seen renewal. Then it
//     is dead, and dropped once ten lease durations have passed, as a dead
//     Lease would be deleted.
//
// The tracker's memory is its own: a new observer starts with the times
// written on the Leases and knows nothing of instances that vanished
// before it started. The zero value is ready to use; it is safe for
// concurrent use.
type Tracker struct {
	mu    sync.Mutex
	rings map[string]map[string]*observation // ring -> Lease name -> last observation
}

// observation is what the tracker last saw of one Lease.
type observation struct {
	holder  string
	written time.Time // the reference time written on the Lease
	since   time.Time // when the tracker first saw holder and written
	d       time.Duration
	weight  int
	state   State
}

// reference is the time the Lease's last renewal counts from.
func (o *observation) reference() time.Time {
	if o.written.After(o.since) {
		return o.since
	}
	return o.written
}

// Observe records lease, a member of ring, as seen at now, and returns it as
// a member with the time of its next transition (zero when there is none).
func (t *Tracker) Observe(ring string, lease *coordinationv1.Lease, now time.Time) (Member, time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.observe(ring, lease, now)
}

func (t *Tracker) observe(ring string, lease *coordinationv1.Lease, now time.Time) (Member, time.Time) {
	if t.rings == nil {
		t.rings = map[string]map[string]*observation{}
	}
	seen := t.rings[ring]
	if seen == nil {
		seen = map[string]*observation{}
		t.rings[ring] = seen
	}
	holder := ptr.Deref(lease.Spec.HolderIdentity, "")
	written, d := ReferenceTime(lease), DurationOf(lease)
	o := seen[lease.Name]
	if o == nil || o.holder != holder || !o.written.Equal(written) || o.d != d {
		o = &observation{holder: holder, written: written, since: now, d: d}
		seen[lease.Name] = o
	}
	weight, err := VirtualNodesOf(lease)
	if err != nil {
		weight = 0 // the ring's default; the lease controller reports the label
	}
	o.weight = weight
	state, next := stateAt(lease, o.reference(), now)
	o.state = state
	return Member{ID: lease.Name, VirtualNodes: weight, State: state}, next
}

// Members returns the members of ring at now, sorted by ID, given every
// Lease the ring has now (those in its leaseNamespace with its ring label),
// and the earliest next transition among them (zero when there is none).
// Instances the tracker saw in the ring before that are missing from leases
// are returned in StateVanished until twice their lease duration after
// their last renewal, then as dead until ten lease durations after it;
// orphaned and invalid ones are dropped at once.
func (t *Tracker) Members(ring string, leases []coordinationv1.Lease, now time.Time) ([]Member, time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	members := make([]Member, 0, len(leases))
	present := make(map[string]bool, len(leases))
	var earliest time.Time
	next := func(at time.Time) {
		if !at.IsZero() && (earliest.IsZero() || at.Before(earliest)) {
			earliest = at
		}
	}
	for i := range leases {
		m, at := t.observe(ring, &leases[i], now)
		present[m.ID] = true
		members = append(members, m)
		next(at)
	}
	for id, o := range t.rings[ring] {
		if present[id] {
			continue
		}
		ref := o.reference()
		gone, forgotten := ref.Add(uncertainAfter*o.d), ref.Add(orphanedAfter*o.d)
		switch {
		case o.state == StateInvalid || o.state == StateOrphaned || !now.Before(forgotten):
			delete(t.rings[ring], id)
			continue
		case o.state == StateDead || !now.Before(gone):
			// Proven gone, or held long enough: dead, remembered as long as
			// a dead Lease would be kept, so that its objects move at once.
			o.state = StateDead
			next(forgotten)
		default:
			o.state = StateVanished
			next(gone)
		}
		members = append(members, Member{ID: id, VirtualNodes: o.weight, State: o.state})
	}
	slices.SortFunc(members, func(a, b Member) int { return strings.Compare(a.ID, b.ID) })
	return members, earliest
}

// Forget drops everything the tracker knows of ring (a deleted ring).
func (t *Tracker) Forget(ring string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.rings, ring)
}
