package slots

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"

	. "github.com/onsi/gomega"
)

// planCase is a random input of Plan: holders of count slots among some
// instances, of which members are the ready ones (some holders are not
// members, some members hold nothing).
type planCase struct {
	holders []string
	members []Member
}

func randomPlanCase(rnd *rand.Rand, maxCount, maxInstances, maxWeight int) planCase {
	count := 1 + rnd.IntN(maxCount)
	n := 1 + rnd.IntN(maxInstances)
	var c planCase
	for i := range n {
		if rnd.IntN(4) > 0 {
			c.members = append(c.members, Member{ID: "i-" + strconv.Itoa(i), Weight: 1 + rnd.IntN(maxWeight)})
		}
	}
	c.holders = make([]string, count)
	for s := range c.holders {
		if rnd.IntN(8) > 0 {
			c.holders[s] = "i-" + strconv.Itoa(rnd.IntN(n+1)) // i-n is never a member
		}
	}
	return c
}

func countBy(targets []string) map[string]int {
	out := map[string]int{}
	for _, t := range targets {
		out[t]++
	}
	return out
}

func totalWeight(members []Member) int {
	w := 0
	for _, m := range members {
		w += max(m.Weight, 1)
	}
	return w
}

// TestPlanBalanced: every member's count of slots is within one slot of
// its weighted ideal (strictly), every slot belongs to a member, and with no
// member no slot belongs anywhere.
func TestPlanBalanced(t *testing.T) {
	g := NewWithT(t)
	rnd := rand.New(rand.NewPCG(11, 12))
	for range 2000 {
		c := randomPlanCase(rnd, 600, 40, 5)
		targets := Plan(c.holders, c.members)
		if len(c.members) == 0 {
			g.Expect(targets).To(HaveEach(BeEmpty()))
			continue
		}
		got := countBy(targets)
		g.Expect(got).NotTo(HaveKey(""))
		count, w := len(c.holders), totalWeight(c.members)
		for _, m := range c.members {
			ideal := float64(count) * float64(m.Weight) / float64(w)
			g.Expect(float64(got[m.ID])).To(BeNumerically(">", ideal-1), "member %s of %v", m.ID, c.members)
			g.Expect(float64(got[m.ID])).To(BeNumerically("<", ideal+1), "member %s of %v", m.ID, c.members)
		}
	}
}

// TestPlanMovesOnlyWhatItMust: a slot changes instance only when its
// holder is not a member or holds more than its quota (its count in the
// plan), and then exactly as many of that holder's slots move as it holds
// beyond its quota.
func TestPlanMovesOnlyWhatItMust(t *testing.T) {
	g := NewWithT(t)
	rnd := rand.New(rand.NewPCG(13, 14))
	for range 2000 {
		c := randomPlanCase(rnd, 600, 40, 5)
		if len(c.members) == 0 {
			continue
		}
		targets := Plan(c.holders, c.members)
		quota := countBy(targets)
		held := countBy(c.holders)
		moved := map[string]int{}
		for s, h := range c.holders {
			if h != "" && targets[s] != h {
				moved[h]++
			}
		}
		for _, m := range c.members {
			g.Expect(moved[m.ID]).To(Equal(max(0, held[m.ID]-quota[m.ID])), "member %s", m.ID)
		}
		for h, n := range moved {
			if !slices.ContainsFunc(c.members, func(m Member) bool { return m.ID == h }) {
				g.Expect(n).To(Equal(held[h]), "holder %s is no member: all its slots move", h)
			}
		}
	}
}

// TestPlanMovesFewest: on small rings, no choice of quotas within one slot
// of the ideal moves fewer of the members' slots than the plan (exhaustive
// search over every such choice).
func TestPlanMovesFewest(t *testing.T) {
	g := NewWithT(t)
	rnd := rand.New(rand.NewPCG(15, 16))
	for range 3000 {
		c := randomPlanCase(rnd, 24, 6, 4)
		if len(c.members) == 0 {
			continue
		}
		targets := Plan(c.holders, c.members)
		held := countBy(c.holders)
		moved := 0
		for s, h := range c.holders {
			if targets[s] != h && slices.ContainsFunc(c.members, func(m Member) bool { return m.ID == h }) {
				moved++
			}
		}
		g.Expect(moved).To(Equal(fewestMoves(len(c.holders), c.members, held)), "holders %v members %v", c.holders, c.members)
	}
}

// fewestMoves is the fewest member slots any quotas within one slot of the
// weighted ideal move: min over quotas of Σ max(0, held − quota).
func fewestMoves(count int, members []Member, held map[string]int) int {
	w := totalWeight(members)
	best := -1
	var search func(i, left, moved int)
	search = func(i, left, moved int) {
		if i == len(members) {
			if left == 0 && (best < 0 || moved < best) {
				best = moved
			}
			return
		}
		share := count * max(members[i].Weight, 1)
		options := []int{share / w}
		if share%w != 0 {
			options = append(options, share/w+1)
		}
		for _, q := range options {
			if q <= left {
				search(i+1, left-q, moved+max(0, held[members[i].ID]-q))
			}
		}
	}
	search(0, count, 0)
	return best
}

// TestPlanDeterministic: the plan depends on the set of members, not their
// order, and a plan is its own plan: once the slots are where it puts them,
// nothing moves.
func TestPlanDeterministic(t *testing.T) {
	g := NewWithT(t)
	rnd := rand.New(rand.NewPCG(17, 18))
	for range 1000 {
		c := randomPlanCase(rnd, 600, 40, 5)
		targets := Plan(c.holders, c.members)
		shuffled := slices.Clone(c.members)
		rnd.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		g.Expect(Plan(c.holders, shuffled)).To(Equal(targets))
		g.Expect(Plan(targets, c.members)).To(Equal(targets))
	}
}

// TestPlanAddAndRemove: from a balanced ring of 10 equal instances over 256
// slots, adding an 11th moves only the slots it needs (its quota), and
// removing one moves only the removed instance's slots.
func TestPlanAddAndRemove(t *testing.T) {
	g := NewWithT(t)
	var members []Member
	for i := range 10 {
		members = append(members, Member{ID: "i-" + strconv.Itoa(i), Weight: 1})
	}
	start := Plan(make([]string, 256), members)
	g.Expect(countBy(start)).To(HaveLen(10))

	added := Plan(start, append(slices.Clone(members), Member{ID: "i-10", Weight: 1}))
	var movedTo []string
	for s := range start {
		if added[s] != start[s] {
			movedTo = append(movedTo, added[s])
		}
	}
	g.Expect(movedTo).To(HaveLen(countBy(added)["i-10"]))
	g.Expect(movedTo).To(HaveEach(Equal("i-10")))

	removed := Plan(start, members[1:])
	for s := range start {
		if removed[s] != start[s] {
			g.Expect(start[s]).To(Equal("i-0"), "slot %d", s)
		}
	}
}

// TestPlanWeights: an instance of weight 3 beside one of weight 1 holds 3/4
// of the slots; weights below 1 count as 1.
func TestPlanWeights(t *testing.T) {
	g := NewWithT(t)
	got := countBy(Plan(make([]string, 256), []Member{{ID: "a", Weight: 3}, {ID: "b", Weight: 1}}))
	g.Expect(got).To(Equal(map[string]int{"a": 192, "b": 64}))
	got = countBy(Plan(make([]string, 10), []Member{{ID: "a", Weight: 0}, {ID: "b", Weight: -2}}))
	g.Expect(got).To(Equal(map[string]int{"a": 5, "b": 5}))
}

// TestPlanConsecutive: an instance's new slots from unassigned ones are
// consecutive, which keeps its watch groups few.
func TestPlanConsecutive(t *testing.T) {
	g := NewWithT(t)
	targets := Plan(make([]string, 12), []Member{{ID: "c", Weight: 1}, {ID: "a", Weight: 1}, {ID: "b", Weight: 1}})
	g.Expect(targets).To(Equal([]string{"a", "a", "a", "a", "b", "b", "b", "b", "c", "c", "c", "c"}))
}
