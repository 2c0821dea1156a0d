package membership

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/sharder-dev/sharder/pkg/ring"
)

// Weight returns m's number of virtual nodes: its own, else ringDefault.
func (m Member) Weight(ringDefault int) int {
	if m.VirtualNodes > 0 {
		return m.VirtualNodes
	}
	return ringDefault
}

// RingMembers returns the ready members of members as ring members with
// their weights (ringDefault where a member sets none), sorted by ID, and
// the fingerprint that identifies the ring they build under algorithm.
func RingMembers(algorithm string, ringDefault int, members []Member) ([]ring.Member, string) {
	ready := make([]ring.Member, 0, len(members))
	for _, m := range members {
		if m.State.Ready() {
			ready = append(ready, ring.Member{ID: m.ID, VirtualNodes: m.Weight(ringDefault)})
		}
	}
	slices.SortFunc(ready, func(a, b ring.Member) int { return strings.Compare(a.ID, b.ID) })
	var fp strings.Builder
	fp.WriteString(algorithm)
	for _, m := range ready {
		fp.WriteString(" " + m.ID + "=" + strconv.Itoa(m.VirtualNodes))
	}
	return ready, fp.String()
}

// Rings builds the ring of each named ring from its members and keeps the
// last one built per ring, so that a ring is rebuilt only when its
// algorithm or its ready instances and their weights change, never per
// object. It is safe for concurrent use: each ring has a lock of its own,
// so a long build of one ring delays only other builds of the same ring.
type Rings struct {
	mu    sync.Mutex // guards slots, never held during a build
	slots map[string]*ringSlot
}

// ringSlot is one ring's last build; mu serializes the ring's builds.
type ringSlot struct {
	mu          sync.Mutex
	fingerprint string
	ring        ring.Ring
}

// Build returns the ring named name over the ready members under algorithm,
// with ringDefault virtual nodes for members that set no weight. rebuilt is
// false when the ring built last time for name had the same membership and
// was returned again. Concurrent builds of the same ring wait for each
// other; builds of other rings do not.
func (r *Rings) Build(name, algorithm string, ringDefault int, members []Member) (rg ring.Ring, rebuilt bool, err error) {
	ready, fp := RingMembers(algorithm, ringDefault, members)
	slot := r.slot(name)
	slot.mu.Lock()
	defer slot.mu.Unlock()
	if slot.ring != nil && slot.fingerprint == fp {
		return slot.ring, false, nil
	}
	built, err := ring.New(algorithm, ready)
	if err != nil {
		return nil, false, fmt.Errorf("building the %s ring %q: %w", algorithm, name, err)
	}
	slot.fingerprint, slot.ring = fp, built
	return built, true, nil
}

// slot returns the slot of ring name, adding it when there is none.
func (r *Rings) slot(name string) *ringSlot {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.slots == nil {
		r.slots = map[string]*ringSlot{}
	}
	s := r.slots[name]
	if s == nil {
		s = &ringSlot{}
		r.slots[name] = s
	}
	return s
}

// Forget drops the ring kept for name (a deleted ring). A build of it
// running meanwhile keeps its result to itself.
func (r *Rings) Forget(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.slots, name)
}
