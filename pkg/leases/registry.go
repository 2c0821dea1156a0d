package leases

import (
	"slices"
	"sync"

	"github.com/sharder-dev/sharder/pkg/membership"
)

// Registry holds the current membership of every ring. The lease controller
// writes it; the assignment engine reads it and subscribes to changes. It is
// safe for concurrent use.
type Registry struct {
	mu          sync.RWMutex
	rings       map[string][]membership.Member
	subscribers []func(ring string)
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{rings: map[string][]membership.Member{}}
}

// Members returns a copy of the ring's members sorted by ID.
func (r *Registry) Members(ring string) []membership.Member {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return slices.Clone(r.rings[ring])
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

// Subscribe registers notify to be called with a ring's name whenever its
// membership changes. notify must not block: hand the name to a workqueue
// or channel.
func (r *Registry) Subscribe(notify func(ring string)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.subscribers = append(r.subscribers, notify)
}
