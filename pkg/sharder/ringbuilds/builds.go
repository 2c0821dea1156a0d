// Package ringbuilds builds the rings of a sharder from their members, once
// per membership: the assignment and the webhook of one process share one
// Builds. It is the sharder's: instances never build a ring.
package ringbuilds

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/ring"
)

// ReadyMembers returns the ready members of members as ring members with
// their weights (ringDefault where a member sets none), sorted by ID, and
// the fingerprint that identifies the ring they build under algorithm.
func ReadyMembers(algorithm string, ringDefault int, members []membership.Member) ([]ring.Member, string) {
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

// Builds builds the ring of each named ring from its members and keeps the
// last keptBuilds built per ring, so that a ring is rebuilt only when its
// algorithm or its ready instances and their weights change, never per
// object. One Builds is meant to be shared by every user of a process's rings
// (the assignment and the webhook of a sharder): for a membership both have
// seen, the second gets the first's ring; while they briefly see two
// memberships (one has observed a Lease the other has not yet), each of the
// two rings is built once, not once per turn. A new ring is derived from the
// ring built last for the same name and algorithm where the algorithm can
// (ring.NewFrom): after one instance joins or leaves, a consistent-hash-dense
// ring of 1,000 instances costs a few milliseconds rather than a build.
//
// It is safe for concurrent use: each ring has a lock of its own, so a long
// build of one ring delays only other builds of the same ring.
type Builds struct {
	// Built, when set, is called after each build with the ring's name
	// (not when a kept ring is returned).
	Built func(name string)

	mu    sync.Mutex // guards slots, never held during a build
	slots map[string]*ringSlot
}

// keptBuilds is how many builds Builds keeps per ring: the rings of the two
// memberships that two users of one ring see while a change reaches one of
// them before the other.
const keptBuilds = 2

// ringSlot is one ring's last builds, the most recent first; mu serializes
// the ring's builds.
type ringSlot struct {
	mu     sync.Mutex
	builds []keptRing
}

// keptRing is a ring built for the membership fingerprint identifies.
type keptRing struct {
	fingerprint string
	algorithm   string
	ring        ring.Ring
}

// Build returns the ring named name over the ready members under algorithm,
// with ringDefault virtual nodes for members that set no weight. rebuilt is
// false when a ring kept for name had the same membership and was returned
// again. Concurrent builds of the same ring wait for each other; builds of
// other rings do not.
func (r *Builds) Build(name, algorithm string, ringDefault int, members []membership.Member) (rg ring.Ring, rebuilt bool, err error) {
	ready, fp := ReadyMembers(algorithm, ringDefault, members)
	slot := r.slot(name)
	slot.mu.Lock()
	defer slot.mu.Unlock()
	var prev ring.Ring
	for i, b := range slot.builds {
		if b.fingerprint == fp {
			// The most recent first: the next ring derives from it.
			copy(slot.builds[1:i+1], slot.builds[:i])
			slot.builds[0] = b
			return b.ring, false, nil
		}
		if prev == nil && b.algorithm == algorithm {
			prev = b.ring
		}
	}
	built, err := ring.NewFrom(algorithm, prev, ready)
	if err != nil {
		return nil, false, fmt.Errorf("building the %s ring %q: %w", algorithm, name, err)
	}
	slot.builds = append([]keptRing{{fingerprint: fp, algorithm: algorithm, ring: built}}, slot.builds[:min(len(slot.builds), keptBuilds-1)]...)
	if r.Built != nil {
		r.Built(name)
	}
	return built, true, nil
}

// slot returns the slot of ring name, adding it when there is none.
func (r *Builds) slot(name string) *ringSlot {
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
func (r *Builds) Forget(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.slots, name)
}
