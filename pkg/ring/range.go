package ring

import (
	"math/bits"
)

// rangeRing splits the hash space into contiguous ranges, one per member in
// ID order, each as wide as the member's share of the total weight. A key
// belongs to the range holding its hash. A membership change shifts the
// ranges' boundaries, so it moves more keys than consistent hashing but
// fewer than hash-mod; members next to each other in ID order share
// neighbouring ranges.
type rangeRing struct{ weightedSlots }

func buildRange(members []Member) (Ring, error) {
	members, err := Normalize(members)
	if err != nil {
		return nil, err
	}
	if len(members) == 0 {
		return emptyRing{}, nil
	}
	return rangeRing{newWeightedSlots(members)}, nil
}

func (r rangeRing) Lookup(key string) (string, error) { return r.LookupHash(hashKey(key)) }

func (r rangeRing) LookupHash(h uint64) (string, error) {
	// The high word of hash * total is floor(hash/2^64 * total): the
	// position of the hash in [0, total), keeping the order of hashes.
	x, _ := bits.Mul64(h, r.total())
	return r.at(x), nil
}
