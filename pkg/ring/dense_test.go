package ring

import (
	"errors"
	"fmt"
	"os"
	"testing"
)

// denseMembers returns n members named like StatefulSet pods, of weight
// weights[i%len(weights)].
func denseMembers(n int, weights ...int) []Member {
	ms := make([]Member, n)
	for i := range ms {
		ms[i] = Member{ID: fmt.Sprintf("instance-%d", i), VirtualNodes: weights[i%len(weights)]}
	}
	return ms
}

func mustBuildDense(t *testing.T, ms []Member) *denseRing {
	t.Helper()
	r, err := buildDense(ms)
	if err != nil {
		t.Fatalf("building a %s ring of %d members: %v", ConsistentHashDense, len(ms), err)
	}
	dr, ok := r.(*denseRing)
	if !ok {
		t.Fatalf("building a %s ring of %d members gave a %T", ConsistentHashDense, len(ms), r)
	}
	return dr
}

// The helpers below that read every one of a ring's 4,194,304 partitions
// are marked go:norace: they read, in the test's goroutine, rings that no
// goroutine writes any more, and instrumenting each of those reads for the
// race detector made most of these tests' time under -race (make test). The
// ring code they call is instrumented as usual.

// partitionShares returns every member's partitions divided by its fair
// share (its weight over the total): the ring's exact balance, without the
// sampling noise of keys.
//
//go:norace
func partitionShares(r *denseRing) map[string]float64 {
	perSlot := make([]int, len(r.ids))
	for q := range uint32(densePartitions) {
		perSlot[r.chunks[q/denseChunkSize].owners[q%denseChunkSize]]++
	}
	counts := make(map[string]int, len(r.memberList))
	for slot, n := range perSlot {
		if n > 0 {
			counts[r.ids[slot]] += n
		}
	}
	total := float64(totalWeight(r.memberList))
	shares := make(map[string]float64, len(counts))
	for _, m := range r.memberList {
		shares[m.ID] = float64(counts[m.ID]) / float64(densePartitions) / (float64(m.VirtualNodes) / total)
	}
	return shares
}

// The largest member holds at most 1.10 times its fair share, with equal and
// with mixed weights. The bound checked is tighter, so that keys (which add
// their own sampling noise) stay within 1.10 too.
func TestDenseBalance(t *testing.T) {
	for _, tc := range []struct {
		n       int
		weights []int
	}{
		{2, []int{512}},
		{10, []int{512}},
		{100, []int{512}},
		{1000, []int{512}},
		{10, []int{256, 512, 1024}},
		{300, []int{256, 512, 1024}},
		{1000, []int{256, 512, 1024}},
		{50, []int{2000, 10000}},
	} {
		t.Run(fmt.Sprintf("%d/%v", tc.n, tc.weights), func(t *testing.T) {
			hi, lo := 0.0, 2.0
			for _, s := range partitionShares(mustBuildDense(t, denseMembers(tc.n, tc.weights...))) {
				hi, lo = max(hi, s), min(lo, s)
			}
			if hi > 1.07 || lo < 0.9 {
				t.Fatalf("shares over the fair share from %.4f to %.4f, want at most 1.07 and at least 0.9", lo, hi)
			}
		})
	}
}

// Adding a member moves partitions only onto it, removing one moves only its
// partitions, and either moves at most 1.10 times the ideal.
func TestDenseMovement(t *testing.T) {
	for _, n := range []int{2, 10, 100, 1000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			ms := denseMembers(n+1, 512)
			before, after := mustBuildDense(t, ms[:n]), mustBuildDense(t, ms)
			added := ms[n].ID
			moved, p, was, is := movedPartitions(before, after, func(_, is string) bool { return is == added })
			if p >= 0 {
				t.Fatalf("partition %d moved from %s to %s when %s was added", p, was, is, added)
			}
			// Removing ms[n] from after gives before back: the same check
			// read the other way covers removal. Removing another member
			// moves only its partitions.
			ideal := float64(densePartitions) / float64(n+1)
			if got := float64(moved) / ideal; got > 1.10 || got < 0.9 {
				t.Fatalf("adding one member to %d moved %.3f times the ideal", n, got)
			}
			if n < 3 {
				return
			}
			gone := ms[n/2].ID
			rest := append(append([]Member{}, ms[:n/2]...), ms[n/2+1:n]...)
			removed := mustBuildDense(t, rest)
			moved, p, was, is = movedPartitions(before, removed, func(was, _ string) bool { return was == gone })
			if p >= 0 {
				t.Fatalf("partition %d moved from %s to %s when %s was removed", p, was, is, gone)
			}
			if got := float64(moved) / (float64(densePartitions) / float64(n)); got > 1.10 || got < 0.9 {
				t.Fatalf("removing one member of %d moved %.3f times the ideal", n, got)
			}
		})
	}
}

// Doubling a member's weight doubles its share, and the table does not
// depend on the order members are given in (Normalize sorts them; the
// member index order is the ID order).
func TestDenseWeightsAndOrder(t *testing.T) {
	ms := denseMembers(20, 512)
	ms[7].VirtualNodes = 1024
	r := mustBuildDense(t, ms)
	if s := partitionShares(r)[ms[7].ID]; s < 0.93 || s > 1.07 {
		t.Fatalf("member of weight 1024 holds %.3f of its fair share", s)
	}
	reversed := make([]Member, len(ms))
	for i, m := range ms {
		reversed[len(ms)-1-i] = m
	}
	reversed = append(reversed, ms[3], Member{ID: ms[7].ID, VirtualNodes: 1}) // duplicates: the largest weight wins
	other := mustBuildDense(t, reversed)
	if _, p, _, _ := movedPartitions(r, other, func(string, string) bool { return false }); p >= 0 {
		t.Fatalf("partition %d: reversed members with duplicates give another owner", p)
	}
}

// movedPartitions compares the owners of every partition in before and
// after: it returns how many partitions changed owner and the first change
// that ok does not allow (was, is: the owners before and after), p -1 if
// none.
//
//go:norace
func movedPartitions(before, after *denseRing, ok func(was, is string) bool) (moved int, p int64, was, is string) {
	for q := range uint32(densePartitions) {
		if was, is := before.owner(q), after.owner(q); was != is {
			if !ok(was, is) {
				return moved, int64(q), was, is
			}
			moved++
		}
	}
	return moved, -1, "", ""
}

func TestDensePointCounts(t *testing.T) {
	ms := denseMembers(3, 1, 512, MaxWeight)
	if got := densePointCounts(ms); got[0] != DensePointsPerWeight || got[1] != 512*DensePointsPerWeight || got[2] != MaxWeight*DensePointsPerWeight {
		t.Fatalf("point counts below the cap = %v, want weight times %d", got, DensePointsPerWeight)
	}
	// At the cap: 2,048 members of the default weight keep their points.
	atCap := denseMembers(MaxDensePoints/(512*DensePointsPerWeight), 512)
	for _, c := range densePointCounts(atCap) {
		if c != 512*DensePointsPerWeight {
			t.Fatalf("a member of %d at the cap has %d points", len(atCap), c)
		}
	}
	// Above it, every member is scaled down in proportion, to at least one
	// point, and the total stays within the cap.
	huge := denseMembers(1000, MaxWeight, 1)
	counts := densePointCounts(huge)
	total := 0
	for _, c := range counts {
		total += c
	}
	if total > MaxDensePoints || counts[0] != 16775 || counts[1] != 1 {
		t.Fatalf("scaled point counts: total %d (cap %d), weights %d and 1 got %d and %d", total, MaxDensePoints, MaxWeight, counts[0], counts[1])
	}
	r := mustBuildDense(t, huge)
	if s := partitionShares(r)[huge[0].ID]; s < 0.9 || s > 1.1 {
		t.Fatalf("a member of the largest weight above the cap holds %.3f of its fair share", s)
	}
}

func TestDenseEdgeCases(t *testing.T) {
	r, err := buildDense([]Member{{ID: "only", VirtualNodes: 0}})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := r.Lookup("g/Kind/ns/name"); got != "only" || err != nil {
		t.Fatalf("Lookup on a ring of one member = %q, %v", got, err)
	}
	if _, err := buildDense(denseMembers(MaxDenseMembers+1, 1)); err == nil {
		t.Fatalf("%d members gave no error", MaxDenseMembers+1)
	}
	if _, err := buildDense([]Member{{ID: "a"}, {ID: ""}}); !errors.Is(err, ErrInvalidMember) {
		t.Fatalf("an empty ID: error = %v, want ErrInvalidMember", err)
	}
	// Weight-1 members: few points, but every partition has an owner.
	small := mustBuildDense(t, denseMembers(3, 1))
	if len(partitionShares(small)) != 3 {
		t.Fatalf("shares %v", partitionShares(small))
	}
}

// TestDenseEverySize checks the exact shares of every ring size from 2 to
// 1,000 instances, with equal and with mixed weights: the largest over its
// fair share, and the share of an instance added to each (the keys adding
// it moves, over the ideal). It takes minutes, so it runs only when
// RING_EVERY_SIZE is set:
//
//	RING_EVERY_SIZE=1 go test ./pkg/ring -run TestDenseEverySize -v -timeout 30m
func TestDenseEverySize(t *testing.T) {
	if os.Getenv("RING_EVERY_SIZE") == "" {
		t.Skip("RING_EVERY_SIZE is not set")
	}
	for _, weights := range [][]int{{512}, {256, 512, 1024}} {
		worst, worstAdd, worstSize, worstAddSize := 0.0, 0.0, 0, 0
		ms := denseMembers(1001, weights...)
		for n := 2; n <= 1000; n++ {
			for _, s := range partitionShares(mustBuildDense(t, ms[:n])) {
				if s > worst {
					worst, worstSize = s, n
				}
			}
			if s := partitionShares(mustBuildDense(t, ms[:n+1]))[ms[n].ID]; s > worstAdd {
				worstAdd, worstAddSize = s, n
			}
		}
		t.Logf("weights %v, 2 to 1,000 instances: largest share over the fair share %.4f (%d instances), an added instance's share over the ideal %.4f (to %d instances)",
			weights, worst, worstSize, worstAdd, worstAddSize)
		// 1.09 leaves room under the 1.10 bar for the keys' own noise.
		if worst > 1.09 || worstAdd > 1.09 {
			t.Errorf("weights %v: largest %.4f, added %.4f: want at most 1.09", weights, worst, worstAdd)
		}
	}
}
