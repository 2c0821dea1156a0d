package leasecontroller

import (
	"slices"
	"strings"
	"sync"

	"github.com/sharder-dev/sharder/pkg/membership"
)

// Registry holds the current membership of every ring. The lease controller
// writes it; the assignment engine reads it and subscribes to changes. It is
// safe for concurrent use.
type Registry struct {
	mu       sync.RWMutex
	rings    map[string][]membership.Member
	assigned map[string]map[string]int32
	// moving counts, per ring and instance, the moves of a gone instance's
	// objects in flight (BeginMove).
	moving      map[string]map[string]int
	subscribers []func(ring string)
	// stranded are called when objects of an instance that is no member,
	// or cannot move, are counted (SubscribeStranded).
	stranded []func(ring string)
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{rings: map[string][]membership.Member{}, moving: map[string]map[string]int{}}
}

// Members returns a copy of the ring's members sorted by ID.
func (r *Registry) Members(ring string) []membership.Member {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return slices.Clone(r.rings[ring])
}

// Member returns ring's member id as last published, and whether it is
// one, without copying the membership.
func (r *Registry) Member(ring, id string) (membership.Member, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	members := r.rings[ring]
	i, ok := slices.BinarySearchFunc(members, id, func(m membership.Member, id string) int { return strings.Compare(m.ID, id) })
	if !ok {
		return membership.Member{}, false
	}
	return members[i], true
}

// Rings returns the names of the rings that have members, sorted.
func (r *Registry) Rings() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	names := make([]string, 0, len(r.rings))
	for name := range r.rings {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// Set replaces the ring's membership. Subscribers are called, synchronously
// and outside the lock, only when the membership differs from the previous
// one. Set reports whether it changed.
func (r *Registry) Set(ring string, members []membership.Member) bool {
	members = slices.Clone(members)
	slices.SortFunc(members, func(a, b membership.Member) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	r.mu.Lock()
	if slices.Equal(r.rings[ring], members) {
		r.mu.Unlock()
		return false
	}
	if len(members) == 0 {
		delete(r.rings, ring)
	} else {
		r.rings[ring] = members
	}
	subs := slices.Clone(r.subscribers)
	r.mu.Unlock()
	for _, notify := range subs {
		notify(ring)
	}
	return true
}

// HasReady reports whether ring has a ready instance: objects of gone
// instances can move only then.
func (r *Registry) HasReady(ring string) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return slices.ContainsFunc(r.rings[ring], func(m membership.Member) bool { return m.State.Ready() })
}

// SetAssigned records how many main objects of ring carry each instance's
// shard label, as the assignment engine counts them from its synced caches.
// The lease controller holds the Lease of a dead instance while objects
// still carry its label and can move, so that the instance cannot come back
// while they are being moved.
func (r *Registry) SetAssigned(ring string, counts map[string]int32) {
	r.mu.Lock()
	if r.assigned == nil {
		r.assigned = map[string]map[string]int32{}
	}
	if counts == nil {
		delete(r.assigned, ring)
		r.mu.Unlock()
		return
	}
	before := r.assigned[ring]
	r.assigned[ring] = counts
	// A holder of objects, not counted before, that is no member or is a
	// gone member whose objects cannot move: the lease controller makes it
	// a member and holds it.
	stranded := false
	members := r.rings[ring]
	for id, n := range counts {
		if n <= 0 || before[id] > 0 {
			continue
		}
		i, found := slices.BinarySearchFunc(members, id, func(m membership.Member, id string) int { return strings.Compare(m.ID, id) })
		if !found || members[i].State.Gone() && !members[i].Movable {
			stranded = true
			break
		}
	}
	subs := slices.Clone(r.stranded)
	r.mu.Unlock()
	if stranded {
		for _, notify := range subs {
			notify(ring)
		}
	}
}

// SubscribeStranded registers notify to be called with a ring's name when
// SetAssigned counts objects of an instance that held none before and is
// no member of the ring, or is a gone member whose objects cannot move
// (the sharder does not hold its Lease). notify must not block.
func (r *Registry) SubscribeStranded(notify func(ring string)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stranded = append(r.stranded, notify)
}

// AssignedTo returns, sorted, the instances that hold objects (main
// objects, or slots in slot mode) of ring as last counted (SetAssigned).
func (r *Registry) AssignedTo(ring string) []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	ids := make([]string, 0, len(r.assigned[ring]))
	for id, n := range r.assigned[ring] {
		if n > 0 {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// Assigned returns how many main objects of ring carry instance id's shard
// label, and false when nothing was counted for the ring yet.
func (r *Registry) Assigned(ring, id string) (int32, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	counts, ok := r.assigned[ring]
	return counts[id], ok
}

// Subscribe registers notify to be called with a ring's name whenever its
// membership changes. notify must not block: hand the name to a workqueue
// or channel.
func (r *Registry) Subscribe(notify func(ring string)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.subscribers = append(r.subscribers, notify)
}

// BeginMove is called by the assignment engine before it writes a move of
// an object of instance id, which is gone, away from it. It reports whether
// the move may be sent: the instance is movable in the membership as last
// published (membership.Member.Movable: the sharder holds its Lease), or
// id is not a valid instance ID (membership.InvalidID: no Lease can have
// that name, so no process can hold it). An instance that is no member yet
// is not movable: the lease controller makes it one from the counts of
// SetAssigned, and holds it before its objects move. When it may, the move counts as in flight until done is called,
// once the write has returned: the lease controller releases the sharder's
// hold of the instance's Lease, which the instance may take back at once,
// only when no move of its objects is in flight (MovesInFlight). The check
// and the count are one step under the lock Set takes, so a move either
// began before a membership without the hold was published or is refused.
func (r *Registry) BeginMove(ring, id string) (done func(), ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	members := r.rings[ring]
	i, found := slices.BinarySearchFunc(members, id, func(m membership.Member, id string) int { return strings.Compare(m.ID, id) })
	switch {
	case found && (!members[i].State.Gone() || !members[i].Movable):
		return nil, false
	case !found && membership.InvalidID(id) == nil:
		return nil, false
	}
	if r.moving[ring] == nil {
		r.moving[ring] = map[string]int{}
	}
	r.moving[ring][id]++
	var once sync.Once
	return func() {
		once.Do(func() {
			r.mu.Lock()
			defer r.mu.Unlock()
			if r.moving[ring][id]--; r.moving[ring][id] <= 0 {
				delete(r.moving[ring], id)
				if len(r.moving[ring]) == 0 {
					delete(r.moving, ring)
				}
			}
		})
	}, true
}

// MovesInFlight returns how many moves of instance id's objects began
// (BeginMove) and have not returned yet.
func (r *Registry) MovesInFlight(ring, id string) int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.moving[ring][id]
}
