package slots

import (
	"cmp"
	"slices"
)

// Member is a ready instance as Plan sees it.
type Member struct {
	// ID is the instance ID. IDs are unique.
	ID string
	// Weight is the instance's weight (its virtual nodes); less than 1
	// counts as 1.
	Weight int
}

// Plan returns where each slot belongs: the instance among members (the
// ring's ready instances) it should be granted to, by slot; all "" when
// members is empty. holders is the holder of every slot now (Table.Holders;
// "" for an unassigned slot).
//
// Each member gets a quota of ⌊count × w / W⌋ slots or one more (W the
// members' total weight): the one more goes to as many members as the count
// requires, chosen among those whose share has a fraction, those holding
// more than their lower quota first, then those with the larger fraction,
// then by ID. So every quota is within one slot of the member's weighted
// ideal (strictly, |quota − count × w / W| < 1), and no quotas within one
// slot of the ideal move fewer slots. Each member keeps the slots it holds
// up to its quota, its lowest numbers first; the slots left over (of
// holders that are not members, beyond a holder's quota, or unassigned)
// go, lowest first, to the members below their quota in the order of their
// IDs, each taking what it lacks, so that its new slots tend to be
// consecutive.
//
// A slot changes instance only when its holder is not a member or holds
// more than its quota; the result depends only on holders and the set of
// members, never on their order, and Plan of its own result returns it
// unchanged.
func Plan(holders []string, members []Member) []string {
	count := len(holders)
	targets := make([]string, count)
	if len(members) == 0 || count == 0 {
		return targets
	}
	ms := slices.Clone(members)
	slices.SortFunc(ms, func(a, b Member) int { return cmp.Compare(a.ID, b.ID) })
	index := make(map[string]int, len(ms))
	for i := range ms {
		ms[i].Weight = max(ms[i].Weight, 1)
		index[ms[i].ID] = i
	}
	held := make([]int, len(ms))
	for _, h := range holders {
		if i, ok := index[h]; ok {
			held[i]++
		}
	}
	quota := quotas(count, ms, held)

	kept := make([]int, len(ms))
	free := make([]int, 0, count)
	for slot, h := range holders {
		if i, ok := index[h]; ok && kept[i] < quota[i] {
			targets[slot] = h
			kept[i]++
			continue
		}
		free = append(free, slot)
	}
	for i := range ms {
		n := quota[i] - kept[i]
		for _, slot := range free[:n] {
			targets[slot] = ms[i].ID
		}
		free = free[n:]
	}
	return targets
}

// quotas returns the quota of each member of ms (sorted by ID, weights at
// least 1) holding held slots, for count slots (Plan).
func quotas(count int, ms []Member, held []int) []int {
	var total int64
	for _, m := range ms {
		total += int64(m.Weight)
	}
	quota := make([]int, len(ms))
	fraction := make([]int64, len(ms)) // count × w mod W: the share's fraction, in units of 1/W
	extra := count
	var candidates []int
	for i, m := range ms {
		share := int64(count) * int64(m.Weight)
		quota[i] = int(share / total)
		fraction[i] = share % total
		extra -= quota[i]
		if fraction[i] > 0 {
			candidates = append(candidates, i)
		}
	}
	// extra = Σ fractions / W < len(candidates): the one more goes to
	// members with a fraction only.
	slices.SortStableFunc(candidates, func(a, b int) int {
		if over := held[a] > quota[a]; over != (held[b] > quota[b]) {
			if over {
				return -1
			}
			return 1
		}
		return cmp.Compare(fraction[b], fraction[a]) // then by ID: ms is sorted and the sort stable
	})
	for _, i := range candidates[:extra] {
		quota[i]++
	}
	return quota
}
