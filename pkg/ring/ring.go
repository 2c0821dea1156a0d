package ring

import (
	"errors"
)

// ErrNoInstance is returned by Lookup when the ring has no instance to
// assign a key to.
var ErrNoInstance = errors.New("no instance available")

// Member is an instance of a ring with its weight.
type Member struct {
	// ID is the instance ID (= Lease name).
	ID string
	// VirtualNodes is the instance's weight: its number of virtual nodes
	// (consistent-hash), or its relative share (other algorithms). Values
	// below 1 are treated as 1; values above MaxVirtualNodes are capped.
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
