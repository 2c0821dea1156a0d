package ring

import (
	"sort"
)

// weightedSlots maps a number in [0, total weight) to the member whose slot
// holds it; slots are laid out in ID order, each as wide as its member's
// weight.
type weightedSlots struct {
	memberList
	ends []uint64 // ends[i] = sum of the weights of members[0..i]
}

func newWeightedSlots(members []Member) weightedSlots {
	s := weightedSlots{memberList: members, ends: make([]uint64, len(members))}
	var end uint64
	for i, m := range members {
		end += uint64(m.VirtualNodes) //nolint:gosec // Normalize clamps weights to [1, MaxWeight]
		s.ends[i] = end
	}
	return s
}

func (s weightedSlots) total() uint64 { return s.ends[len(s.ends)-1] }

// at returns the ID of the member whose slot holds x < total.
func (s weightedSlots) at(x uint64) string {
	return s.memberList[sort.Search(len(s.ends), func(i int) bool { return x < s.ends[i] })].ID
}

// hashModRing assigns a key to slot hash(key) mod total weight. Balanced and
// simple, but a membership change moves most keys: only for rings whose
// membership rarely changes.
type hashModRing struct{ weightedSlots }

func buildHashMod(members []Member) (Ring, error) {
	members, err := Normalize(members)
	if err != nil {
		return nil, err
	}
	if len(members) == 0 {
		return emptyRing{}, nil
	}
	return hashModRing{newWeightedSlots(members)}, nil
}

func (r hashModRing) Lookup(key string) (string, error) { return r.LookupHash(hashKey(key)) }

func (r hashModRing) LookupHash(h uint64) (string, error) { return r.at(h % r.total()), nil }
