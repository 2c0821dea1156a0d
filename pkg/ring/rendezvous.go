package ring

import (
	"math"
)

// rendezvousRing is weighted highest-random-weight hashing: a key goes to the
// member with the highest score -w/ln(h), where h in (0, 1) is a hash of the
// key and the member's ID. Each member wins a share of keys proportional to
// its weight, and a membership change moves only the keys the change must
// move. A lookup costs one key hash and one mix per member.
type rendezvousRing struct {
	memberList
	seeds   []uint64 // hash of each member's ID
	weights []float64
	equal   bool // all weights equal: compare hashes, skip the logarithm
}

func buildRendezvous(members []Member) (Ring, error) {
	members, err := Normalize(members)
	if err != nil {
		return nil, err
	}
	if len(members) == 0 {
		return emptyRing{}, nil
	}
	r := &rendezvousRing{memberList: members, equal: true}
	for _, m := range members {
		r.seeds = append(r.seeds, hashKey(m.ID))
		r.weights = append(r.weights, float64(m.VirtualNodes))
		r.equal = r.equal && m.VirtualNodes == members[0].VirtualNodes
	}
	return r, nil
}

func (r *rendezvousRing) Lookup(key string) (string, error) { return r.LookupHash(hashKey(key)) }

func (r *rendezvousRing) LookupHash(k uint64) (string, error) {
	best := 0
	if r.equal {
		var bestHash uint64
		for i, seed := range r.seeds {
			// Ties go to the member first in ID order.
			if h := mix64(k ^ seed); i == 0 || h > bestHash {
				best, bestHash = i, h
			}
		}
		return r.memberList[best].ID, nil
	}
	bestScore := math.Inf(-1)
	for i, seed := range r.seeds {
		// h in (0, 1): the top 53 bits of the mixed hash, offset by half a
		// step so that neither 0 nor 1 occurs.
		h := (float64(mix64(k^seed)>>11) + 0.5) / (1 << 53)
		if score := -r.weights[i] / math.Log(h); score > bestScore {
			best, bestScore = i, score
		}
	}
	return r.memberList[best].ID, nil
}
