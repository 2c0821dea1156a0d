package membership

import (
	"slices"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/utils/ptr"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// SharderHolderPrefix starts the holder identity of every Lease a sharder
// takes or holds ("sharder:<pod name or hostname>"); a colon cannot occur
// in a Lease name, so no instance ID has it.
const SharderHolderPrefix = "sharder:"

// Tracker computes the members of rings from their Leases as one observer
// (the sharder, or a webhook replica) sees them over time, on the
// observer's own clock. No time written on a Lease by another node decides
// anything:
//
//   - A renewal counts from when the tracker first observed it (a Lease
//     whose holder, renewTime or duration changed). A Lease counts as
//     renewed when the tracker first sees it, however old or new the
//     renewTime written on it: a clock on another node that lags or runs
//     ahead, or steps, changes nothing. This is how client-go's leader
//     election measures expiry. A new observer (a new sharder leader)
//     therefore starts with every Lease as observed now; instances that
//     stopped before it started are found expired d later, and their
//     objects are held meanwhile, as those of every instance that is not
//     proven gone.
//   - An instance whose Lease disappears from its ring (deleted, its
//     sharder.dev/ring label changed, or the ring's leaseNamespace changed)
//     without having been released or taken is not proven gone. It stays a
//     member in StateVanished, holding its objects, until twice its last
//     seen lease duration has passed since its last observed renewal. Then
//     it is dead, and dropped once ten lease durations have passed, as a
//     dead Lease would be deleted.
//   - A Lease handed back for a restart (no holder, the
//     sharder.dev/restarting annotation) is restarting for the ring's
//     restart hold after the tracker saw it, then dead.
//   - A gone instance is movable (Member.Movable) only while the sharder
//     holds its Lease by a write recorded with Hold, for two thirds of the
//     duration written: the instance cannot acquire the Lease before it has
//     watched it unrenewed for its whole duration, counted from after the
//     write, so the rest is the margin for moves already sent. This holds
//     for every way an instance goes: a released, taken, deleted or never
//     seen Lease (the sharder creates an absent one to hold it) and one
//     held by somebody else (the sharder takes it once nobody renewed it
//     for its duration).
//
// Elapsed times are differences of the clock's readings; with the real
// clock those come from Go's monotonic clock, which a step of the wall
// clock does not move. The zero value is ready to use; it is safe for
// concurrent use. Each ring has a lock of its own: calls for different rings
// never wait for each other.
type Tracker struct {
	// WriteTimeout is how long after it is sent a move of a held
	// instance's objects may still land: the sharder's write timeout, which
	// the API server enforces. The objects are movable after a hold write
	// that started at t and gave the Lease duration d until t + min(2d/3, d
	// − WriteTimeout), but at least until t + d/3: the instance cannot
	// acquire the Lease before t + d, so a move sent in the window lands
	// before it could be back. Set it before the first Hold. Default 0:
	// 2d/3.
	WriteTimeout time.Duration

	mu    sync.Mutex // guards rings, the map only
	rings map[string]*ringObservations
}

// MovableFor is how long after a hold write that gave the Lease duration d
// the instance's objects may move (Tracker.WriteTimeout).
func (t *Tracker) MovableFor(d time.Duration) time.Duration {
	return max(min(d*2/3, d-t.WriteTimeout), d/3)
}

// ringObservations is what the tracker saw of one ring's Leases.
type ringObservations struct {
	mu   sync.Mutex
	seen map[string]*observation // Lease name -> last observation
}

// observation is what the tracker last saw of one Lease.
type observation struct {
	holder     string
	written    time.Time // the reference time written on the Lease: tells renewals apart
	d          time.Duration
	restarting bool
	// invalid: the Lease's name is not a valid instance ID (InvalidID),
	// checked once per name, not per observation.
	invalid bool
	since   time.Time // when the tracker first saw this holder, written and d
	weight  int
	lag     time.Duration // the promised max watch lag (MaxWatchLagOf)
	stop    time.Duration // the promised bound on stopping (MaxStopOf)
	state   State
	// heldAt is when the sharder's last write holding the Lease started
	// (Hold), zero when it does not hold it; movableFor is how long after
	// it the objects may move (Tracker.WriteTimeout).
	heldAt     time.Time
	movableFor time.Duration
	// absent: the Lease was missing from the ring's Leases when the
	// tracker last looked (Members, Vanish).
	absent bool
}

// restartingLease reports whether lease was handed back for a restart.
func restartingLease(lease *coordinationv1.Lease) bool {
	_, ok := lease.Annotations[v1alpha1.AnnotationRestarting]
	return ok && ptr.Deref(lease.Spec.HolderIdentity, "") == ""
}

// Observe records lease, a member of ring, as seen at now, and returns it as
// a member with the time of its next transition (zero when there is none).
// restartHold is the ring's restart hold (0: none).
func (t *Tracker) Observe(ring string, restartHold time.Duration, lease *coordinationv1.Lease, now time.Time) (Member, time.Time) {
	r := t.ring(ring)
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.observe(restartHold, lease, now)
}

// Renewed records a renewal of lease, a member of ring whose last
// observation was ready and held by the instance itself, as seen at now,
// and reports whether it is ready: the verdict Observe would give. A Lease
// that differs from that observation in anything but its renewal time (its
// holder or duration), or that the tracker did not see ready, is not
// recorded and reports false: Observe it. It takes constant time, so that
// it can be called for every renewal as it arrives.
func (t *Tracker) Renewed(ring string, lease *coordinationv1.Lease, now time.Time) bool {
	t.mu.Lock()
	r := t.rings[ring]
	t.mu.Unlock()
	if r == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	o := r.seen[lease.Name]
	holder := ptr.Deref(lease.Spec.HolderIdentity, "")
	if o == nil || o.absent || o.state != StateReady || holder != lease.Name || o.holder != holder || o.d != DurationOf(lease) {
		return false
	}
	// The holder is the instance itself, so the Lease is not restarting and
	// the restart hold plays no part.
	m, _ := r.observe(0, lease, now)
	return m.State == StateReady
}

// ring returns the observations of ring, adding them when there are none.
// The caller locks them.
func (t *Tracker) ring(ring string) *ringObservations {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.rings == nil {
		t.rings = map[string]*ringObservations{}
	}
	r := t.rings[ring]
	if r == nil {
		r = &ringObservations{seen: map[string]*observation{}}
		t.rings[ring] = r
	}
	return r
}

func (r *ringObservations) observe(restartHold time.Duration, lease *coordinationv1.Lease, now time.Time) (Member, time.Time) {
	seen := r.seen
	holder := ptr.Deref(lease.Spec.HolderIdentity, "")
	written, d, restarting := ReferenceTime(lease), DurationOf(lease), restartingLease(lease)
	o := seen[lease.Name]
	if o == nil || o.holder != holder || !o.written.Equal(written) || o.d != d || o.restarting != restarting {
		fresh := &observation{holder: holder, written: written, since: now, d: d, restarting: restarting}
		if o != nil {
			fresh.invalid = o.invalid
		} else {
			fresh.invalid = InvalidID(lease.Name) != nil
		}
		if o != nil && holder != lease.Name {
			// The sharder's hold outlives a version the cache delivers late:
			// only the instance itself holding the Lease again ends it.
			fresh.heldAt, fresh.movableFor = o.heldAt, o.movableFor
		}
		o = fresh
		seen[lease.Name] = o
	}
	o.absent = false
	weight, err := VirtualNodesOf(lease)
	if err != nil {
		weight = 0 // the ring's default; the lease controller reports the label
	}
	o.weight = weight
	lag, err := MaxWatchLagOf(lease)
	if err != nil {
		lag = 0 // no promise; the lease controller reports the annotation
	}
	o.lag = lag
	o.stop = maxStop(lease)
	var state State
	var next time.Time
	switch end := o.since.Add(restartHold); {
	case o.invalid:
		state = StateInvalid
	case o.restarting && restartHold > 0 && now.Before(end):
		state, next = StateRestarting, end
	default:
		state, next = validStateAt(lease, o.since, now)
	}
	o.state = state
	movable, until := o.movable(now)
	if movable && !until.IsZero() && (next.IsZero() || until.Before(next)) {
		next = until
	}
	return Member{ID: lease.Name, VirtualNodes: weight, State: state, Movable: movable, MaxWatchLag: lag, MaxStop: o.stop}, next
}

// movable reports whether the objects of the instance may move now (see
// Member.Movable), and until when, zero when no time ends it.
func (o *observation) movable(now time.Time) (bool, time.Time) {
	if !o.state.Gone() {
		return false, time.Time{}
	}
	if !o.heldAt.IsZero() {
		if until := o.heldAt.Add(o.movableFor); now.Before(until) {
			return true, until
		}
	}
	// Released (the instance could take it back at once), held by a
	// sharder whose hold this one did not write (a previous leader's hold
	// may lapse at any time), or taken by somebody else (who may stop
	// renewing it, and the instance then acquire it a duration later): the
	// objects move only under this sharder's own hold.
	return false, time.Time{}
}

// heldMovable reports whether the sharder's recorded hold lets the objects
// of an instance whose Lease is absent move now, and until when. The
// sharder holds such an instance by creating its Lease (Hold): without
// that, a process with the instance's ID could create the Lease at any
// moment and start on objects that are being moved.
func (o *observation) heldMovable(now time.Time) (bool, time.Time) {
	if o.heldAt.IsZero() {
		return false, time.Time{}
	}
	if until := o.heldAt.Add(o.movableFor); now.Before(until) {
		return true, until
	}
	return false, time.Time{}
}

// Hold records that the sharder holds the Lease of instance id of ring by
// a write that started at start and gave the Lease duration d: the
// instance's objects are movable until start + 2d/3, less where
// WriteTimeout asks for it.
func (t *Tracker) Hold(ring, id string, start time.Time, d time.Duration) {
	r := t.ring(ring)
	r.mu.Lock()
	defer r.mu.Unlock()
	o := r.seen[id]
	if o == nil {
		o = &observation{since: start, d: d, state: StateDead, invalid: InvalidID(id) != nil}
		r.seen[id] = o
	}
	o.heldAt, o.movableFor = start, t.MovableFor(d)
}

// Expect records that objects carry the label of instance id of ring
// although the tracker never saw its Lease (a Lease deleted before this
// sharder led, or a label written by hand): from now on it is a member
// whose Lease is absent, with lease duration d, vanished for hold, then
// dead, and its objects move only once the sharder holds it (Hold). It
// does nothing for an instance the tracker knows.
func (t *Tracker) Expect(ring, id string, d, hold time.Duration, now time.Time) {
	r := t.ring(ring)
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.seen[id]; ok {
		return
	}
	// Members ends the vanished state at since + GoneAfter(d, 0): since is
	// set back so that it ends after hold.
	o := &observation{holder: id, since: now.Add(hold - GoneAfter(d, 0)), d: d, state: StateVanished, absent: true}
	if InvalidID(id) != nil {
		// No Lease can have this name, so no process can hold it: not
		// remembered (Members drops it), its objects move at once.
		o.invalid, o.state = true, StateInvalid
	}
	r.seen[id] = o
}

// ObservedSince returns when the tracker first saw the current holder,
// reference time and duration of instance id's Lease: the start of the
// time it has gone unrenewed. Zero when it knows no such Lease.
func (t *Tracker) ObservedSince(ring, id string) time.Time {
	r := t.ring(ring)
	r.mu.Lock()
	defer r.mu.Unlock()
	if o := r.seen[id]; o != nil {
		return o.since
	}
	return time.Time{}
}

// LastDuration returns the lease duration last seen on instance id's Lease
// (for an instance known only from its objects, the one Expect was given);
// 0 when the tracker knows nothing of it.
func (t *Tracker) LastDuration(ring, id string) time.Duration {
	r := t.ring(ring)
	r.mu.Lock()
	defer r.mu.Unlock()
	if o := r.seen[id]; o != nil {
		return o.d
	}
	return 0
}

// Absent reports whether instance id of ring is a member whose Lease was
// missing from the ring's Leases when the tracker last looked.
func (t *Tracker) Absent(ring, id string) bool {
	r := t.ring(ring)
	r.mu.Lock()
	defer r.mu.Unlock()
	o := r.seen[id]
	return o != nil && o.absent
}

// Unhold records that the sharder no longer holds the Lease of instance id:
// its objects stop being movable at once.
func (t *Tracker) Unhold(ring, id string) {
	r := t.ring(ring)
	r.mu.Lock()
	defer r.mu.Unlock()
	if o := r.seen[id]; o != nil {
		o.heldAt, o.movableFor = time.Time{}, 0
	}
}

// HeldAt returns when the sharder's last recorded hold of instance id's
// Lease started; zero when it holds none.
func (t *Tracker) HeldAt(ring, id string) time.Time {
	r := t.ring(ring)
	r.mu.Lock()
	defer r.mu.Unlock()
	if o := r.seen[id]; o != nil {
		return o.heldAt
	}
	return time.Time{}
}

// Members returns the members of ring at now, sorted by ID, given every
// Lease the ring has now (those in its leaseNamespace with its ring label),
// and the earliest next transition among them (zero when there is none).
// restartHold is the ring's restart hold. Instances the tracker saw in the
// ring before that are missing from leases are returned in StateVanished
// until twice their lease duration after their last observed renewal, then
// as dead until ten lease durations after it, movable only while the
// sharder holds them (it creates the Lease to hold it, and records that
// with Hold); orphaned and invalid ones are dropped at once.
func (t *Tracker) Members(ring string, restartHold time.Duration, leases []coordinationv1.Lease, now time.Time) ([]Member, time.Time) {
	r := t.ring(ring)
	r.mu.Lock()
	defer r.mu.Unlock()
	members := make([]Member, 0, len(leases))
	present := make(map[string]bool, len(leases))
	var earliest time.Time
	next := func(at time.Time) {
		if !at.IsZero() && (earliest.IsZero() || at.Before(earliest)) {
			earliest = at
		}
	}
	for i := range leases {
		m, at := r.observe(restartHold, &leases[i], now)
		present[m.ID] = true
		members = append(members, m)
		next(at)
	}
	for id, o := range r.seen {
		if present[id] {
			continue
		}
		o.absent = true
		gone, forgotten := o.since.Add(GoneAfter(o.d, o.stop)), o.since.Add(orphanedAfter*o.d)
		switch {
		case o.state == StateInvalid || o.state == StateOrphaned || !now.Before(forgotten):
			delete(r.seen, id)
			continue
		case o.state.Gone() || !now.Before(gone):
			// Proven gone, or held long enough: dead, remembered as long as
			// a dead Lease would be kept. Its objects move only once the
			// sharder created its Lease and holds it (Hold).
			o.state = StateDead
			next(forgotten)
		default:
			o.state = StateVanished
			next(gone)
		}
		movable, until := o.heldMovable(now)
		if movable {
			next(until)
		}
		members = append(members, Member{ID: id, VirtualNodes: o.weight, State: o.state, Movable: movable, MaxWatchLag: o.lag, MaxStop: o.stop})
	}
	slices.SortFunc(members, func(a, b Member) int { return strings.Compare(a.ID, b.ID) })
	return members, earliest
}

// Ready reports whether instance id of ring is ready at now as far as the
// tracker's last observation of its Lease goes: it was held by the
// instance itself, with a valid ID, and now is within its lease duration
// of when the tracker observed the renewal; a Lease Vanish or Members found
// missing is not ready. It is Observe's verdict at now without the Lease,
// and takes constant time, so that it can be asked per request.
func (t *Tracker) Ready(ring, id string, now time.Time) bool {
	r := t.ring(ring)
	r.mu.Lock()
	defer r.mu.Unlock()
	o := r.seen[id]
	return o != nil && !o.absent && !o.invalid && o.holder == id && now.Before(o.since.Add(o.d))
}

// Vanish records that the Lease of instance id left ring (it was deleted,
// or lost the ring's label): Ready is false for it at once, and Members
// reports it as missing from the Leases it is given, as it would anyway.
func (t *Tracker) Vanish(ring, id string) {
	r := t.ring(ring)
	r.mu.Lock()
	defer r.mu.Unlock()
	if o := r.seen[id]; o != nil {
		o.absent = true
	}
}

// Forget drops everything the tracker knows of ring (a deleted ring).
func (t *Tracker) Forget(ring string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.rings, ring)
}
