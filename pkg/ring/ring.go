package ring

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
)

// ErrNoInstance is returned by Lookup when the ring has no instance to
// assign a key to.
var ErrNoInstance = errors.New("no instance available")

// ErrUnknownAlgorithm is wrapped by New when no algorithm has the given name.
var ErrUnknownAlgorithm = errors.New("unknown ring algorithm")

// ErrInvalidMember is wrapped by New and the built-in algorithms when a
// member cannot be placed on a ring (an empty ID).
var ErrInvalidMember = errors.New("invalid ring member")

// Names of the built-in algorithms, as a ControllerRing names them in
// spec.algorithm (which also accepts the name of any registered algorithm).
const (
	ConsistentHash = "consistent-hash"
	// ConsistentHashDense is consistent hashing built for large rings:
	// thousands of points per instance and 2^22 partitions, built in time
	// linear in the number of points. It places keys differently from
	// ConsistentHash, so switching a ring to it moves objects once.
	ConsistentHashDense = "consistent-hash-dense"
	Rendezvous          = "rendezvous"
	HashMod             = "hash-mod"
	Range               = "range"
)

// MaxWeight caps a member's weight so that one member cannot make a ring
// arbitrarily large (a consistent-hash ring holds a point per unit of
// weight). It guards the data structure and is not the rule for weights:
// membership.MaxVirtualNodes bounds what a Lease or a ring's default may ask
// for and is no larger, so a member built from a membership is never capped.
const MaxWeight = 10000

// Member is an instance of a ring with its weight.
type Member struct {
	// ID is the instance ID (= Lease name).
	ID string
	// VirtualNodes is the instance's weight: its number of virtual nodes
	// (consistent-hash), or its relative share (other algorithms). Values
	// below 1 are treated as 1; values above MaxWeight are capped.
	VirtualNodes int
}

// Ring maps hash keys to instances. A Ring is built once for a membership
// and then only read: it is safe for concurrent use, and the same set of
// members gives the same result whatever order they were given in.
type Ring interface {
	// Lookup returns the instance ID for key, or ErrNoInstance.
	Lookup(key string) (string, error)
	// Members returns the ring's members sorted by ID (deduplicated).
	Members() []Member
}

// Algorithm builds rings. Implementations must be deterministic: the ring
// depends only on the set of members, never on their order.
type Algorithm interface {
	// Build returns a ring for members. An empty membership gives a ring
	// whose Lookup returns ErrNoInstance.
	Build(members []Member) (Ring, error)
}

// AlgorithmFunc adapts a function to the Algorithm interface.
type AlgorithmFunc func(members []Member) (Ring, error)

// Build calls f(members).
func (f AlgorithmFunc) Build(members []Member) (Ring, error) { return f(members) }

var _ Algorithm = AlgorithmFunc(nil)

// Deriver is an Algorithm that can build a ring from one it built before for
// a membership that differs by a few members, faster than from nothing.
// Derive must return the ring Build(members) returns: the same placement of
// every key.
type Deriver interface {
	Algorithm
	// Derive returns the ring of members (normalized) from prev, a ring
	// this algorithm built or derived; it may build from nothing whenever
	// deriving does not pay.
	Derive(prev Ring, members []Member) (Ring, error)
}

var (
	registryMu sync.RWMutex
	registry   = map[string]Algorithm{
		ConsistentHash:      defaultConsistentHash,
		ConsistentHashDense: denseAlgorithm{},
		Rendezvous:          AlgorithmFunc(buildRendezvous),
		HashMod:             AlgorithmFunc(buildHashMod),
		Range:               AlgorithmFunc(buildRange),
	}
)

// Register makes a under name available to New, replacing any algorithm
// registered under that name before (built-ins included). It is meant to be
// called from init functions or main before rings are built; it is safe for
// concurrent use. A nil a or an empty name is ignored.
//
// New normalizes the membership before it calls a.Build: members are sorted
// by ID, deduplicated and their weights clamped to [1, MaxWeight], so a
// registered algorithm only has to be deterministic for that input.
func Register(name string, a Algorithm) {
	if name == "" || a == nil {
		return
	}
	registryMu.Lock()
	defer registryMu.Unlock()
	registry[name] = a
}

// Algorithms returns the names New accepts, sorted.
func Algorithms() []string {
	registryMu.RLock()
	defer registryMu.RUnlock()
	names := make([]string, 0, len(registry))
	for name := range registry {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// Registered reports whether New knows an algorithm named name; "" means
// ConsistentHash.
func Registered(name string) bool {
	if name == "" {
		name = ConsistentHash
	}
	registryMu.RLock()
	defer registryMu.RUnlock()
	_, ok := registry[name]
	return ok
}

// New builds a ring for members with the algorithm registered under
// algorithm; "" means ConsistentHash. The membership is normalized first (see
// Normalize). An unknown name gives an error wrapping ErrUnknownAlgorithm.
// New never panics: a panic inside an algorithm is returned as an error.
func New(algorithm string, members []Member) (r Ring, err error) {
	return NewFrom(algorithm, nil, members)
}

// NewFrom is New for a ring that replaces prev, a ring built by NewFrom or New
// with the same algorithm: an algorithm that is a Deriver derives the new
// ring from prev (consistent-hash-dense, after a few members changed). The
// ring is the one New returns; prev is not changed. A nil prev, or a prev
// of another algorithm, builds from nothing.
func NewFrom(algorithm string, prev Ring, members []Member) (r Ring, err error) {
	if algorithm == "" {
		algorithm = ConsistentHash
	}
	registryMu.RLock()
	a, ok := registry[algorithm]
	registryMu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("%w %q (known: %v)", ErrUnknownAlgorithm, algorithm, Algorithms())
	}
	normalized, err := Normalize(members)
	if err != nil {
		return nil, err
	}
	defer func() {
		if p := recover(); p != nil {
			r, err = nil, fmt.Errorf("building %s ring of %d members: %v", algorithm, len(normalized), p)
		}
	}()
	if d, ok := a.(Deriver); ok && prev != nil {
		r, err = d.Derive(prev, normalized)
	} else {
		r, err = a.Build(normalized)
	}
	if err != nil {
		return nil, fmt.Errorf("building %s ring of %d members: %w", algorithm, len(normalized), err)
	}
	if r == nil {
		return nil, fmt.Errorf("building %s ring of %d members: algorithm returned no ring", algorithm, len(normalized))
	}
	return r, nil
}

// Normalize returns members sorted by ID, with weights clamped to
// [1, MaxWeight] and duplicate IDs merged into one member with the
// largest weight given for that ID, so that the result does not depend on the
// order of members. A member with an empty ID is an error wrapping
// ErrInvalidMember. members is not modified.
func Normalize(members []Member) ([]Member, error) {
	out := make([]Member, 0, len(members))
	for _, m := range members {
		if m.ID == "" {
			return nil, fmt.Errorf("%w: empty instance ID", ErrInvalidMember)
		}
		out = append(out, Member{ID: m.ID, VirtualNodes: min(max(m.VirtualNodes, 1), MaxWeight)})
	}
	slices.SortFunc(out, func(a, b Member) int {
		if a.ID != b.ID {
			if a.ID < b.ID {
				return -1
			}
			return 1
		}
		return b.VirtualNodes - a.VirtualNodes // largest weight first, kept by Compact
	})
	return slices.CompactFunc(out, func(a, b Member) bool { return a.ID == b.ID }), nil
}

// emptyRing is the ring of no members.
type emptyRing struct{}

func (emptyRing) Lookup(string) (string, error)     { return "", ErrNoInstance }
func (emptyRing) LookupHash(uint64) (string, error) { return "", ErrNoInstance }
func (emptyRing) Members() []Member                 { return nil }

// memberList is the Members half of the built-in rings.
type memberList []Member

func (l memberList) Members() []Member { return slices.Clone([]Member(l)) }

// totalWeight returns the sum of the members' weights.
func totalWeight(members []Member) int {
	total := 0
	for _, m := range members {
		total += m.VirtualNodes
	}
	return total
}
