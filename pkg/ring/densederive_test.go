package ring

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// A derived ring is the ring a build from nothing gives: the same members,
// partition table and first points, after random additions, removals and
// weight changes, one or several at a time, from rings of every size the
// derivation handles and across the sizes it does not (fewer than two
// members, more than maxDerivedChanges changes).
func TestDeriveDenseMatchesBuild(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rnd := rand.New(rand.NewPCG(seed, 0))
	next := 0
	newMember := func() Member {
		next++
		return Member{ID: fmt.Sprintf("instance-%d", next), VirtualNodes: 1 + rnd.IntN(1024)}
	}
	members := []Member{newMember(), newMember(), newMember()}
	prev, err := New(ConsistentHashDense, members)
	if err != nil {
		t.Fatal(err)
	}
	for step := range 40 {
		changes := 1 + rnd.IntN(3)
		if step%10 == 9 {
			changes = maxDerivedChanges + 1
		}
		for range changes {
			switch i := rnd.IntN(max(len(members), 1)); {
			case len(members) < 2 || rnd.IntN(3) == 0:
				members = append(members, newMember())
			case rnd.IntN(2) == 0:
				members = slices.Delete(members, i, i+1)
			default:
				members[i].VirtualNodes = 1 + rnd.IntN(1024)
			}
		}
		if step == 20 {
			members = members[:1] // a single ring, derived from and to
		}
		derived, err := NewFrom(ConsistentHashDense, prev, members)
		if err != nil {
			t.Fatalf("step %d: deriving a ring of %d members: %v", step, len(members), err)
		}
		built, err := New(ConsistentHashDense, members)
		if err != nil {
			t.Fatalf("step %d: building a ring of %d members: %v", step, len(members), err)
		}
		compareDense(t, fmt.Sprintf("step %d, %d members", step, len(members)), derived, built)
		prev = derived
	}
}

// A ring of 1,000 instances derived after one instance joins, one leaves,
// and one changes weight is the ring built from nothing.
func TestDeriveDenseAtScale(t *testing.T) {
	members := denseMembers(1000, 512)
	prev := mustBuildDense(t, members)
	for _, tc := range []struct {
		name    string
		members []Member
	}{
		{"joined", append(slices.Clone(members), Member{ID: "instance-new", VirtualNodes: 512})},
		{"left", slices.Delete(slices.Clone(members), 500, 501)},
		{"reweighted", func() []Member { ms := slices.Clone(members); ms[7].VirtualNodes = 100; return ms }()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			derived, err := deriveDense(prev, mustNormalize(t, tc.members))
			if err != nil {
				t.Fatal(err)
			}
			compareDense(t, tc.name, derived, mustBuildDense(t, tc.members))
		})
	}
}

func mustNormalize(t *testing.T, ms []Member) []Member {
	t.Helper()
	out, err := Normalize(ms)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// compareDense fails unless derived and built are the same ring. Like
// partitionShares, it is not instrumented by the race detector.
//
//go:norace
func compareDense(t *testing.T, what string, derived, built Ring) {
	t.Helper()
	if !slices.Equal(derived.Members(), built.Members()) {
		t.Fatalf("%s: derived members %v, built %v", what, derived.Members(), built.Members())
	}
	d, dok := derived.(*denseRing)
	b, bok := built.(*denseRing)
	if dok != bok {
		t.Fatalf("%s: derived a %T, built a %T", what, derived, built)
	}
	if !dok {
		return
	}
	inUse := 0
	for _, id := range d.ids {
		if id != "" {
			inUse++
		}
	}
	for j, m := range d.memberList {
		if d.ids[d.slots[j]] != m.ID || inUse != len(d.memberList) {
			t.Fatalf("%s: derived slots %v of IDs %q do not match the members", what, d.slots, d.ids)
		}
	}
	for q := range uint32(densePartitions) {
		if d.owner(q) != b.owner(q) {
			t.Fatalf("%s: partition %d derived to %s, built to %s", what, q, d.owner(q), b.owner(q))
		}
	}
	for c := range d.chunks {
		if d.chunks[c].has != b.chunks[c].has || d.chunks[c].fine != b.chunks[c].fine {
			t.Fatalf("%s: derived first points differ from those built in chunk %d", what, c)
		}
	}
}

// A derived ring shares the chunks of the ring it is derived from that none
// of its partitions changes in: the rings published before it, read
// meanwhile, stay as they were. A chain of derivations, each also branching
// from an earlier ring of the chain, gives the rings built from nothing,
// while lookups read every published ring; each ring's table and first
// points are the same at the end as when it was derived.
func TestDeriveDenseKeepsPublishedRings(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rnd := rand.New(rand.NewPCG(seed, 1))
	members := denseMembers(60, 512, 256, 1024)
	next := len(members)
	published := []*denseRing{mustBuildDense(t, members)}
	digests := []uint64{denseDigest(published[0])}

	keys := make([]string, 2000)
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%d", i)
	}
	lookupAll := func(r *denseRing) []string {
		owners := make([]string, len(keys))
		for i, k := range keys {
			owners[i], _ = r.Lookup(k)
		}
		return owners
	}
	var (
		mu      sync.Mutex
		owners  = [][]string{lookupAll(published[0])}
		stop    atomic.Bool
		readers sync.WaitGroup
	)
	readers.Go(func() { // reads every published ring while the next are derived
		for !stop.Load() {
			mu.Lock()
			rings, want := slices.Clone(published), slices.Clone(owners)
			mu.Unlock()
			for i, r := range rings {
				if got := lookupAll(r); !slices.Equal(got, want[i]) {
					t.Errorf("ring %d: lookups changed after it was published", i)
					return
				}
			}
		}
	})
	defer func() { stop.Store(true); readers.Wait() }()

	derive := func(what string, from *denseRing, ms []Member) *denseRing {
		t.Helper()
		r, err := deriveDense(from, mustNormalize(t, ms))
		if err != nil {
			t.Fatal(err)
		}
		compareDense(t, what, r, mustBuildDense(t, ms))
		return r.(*denseRing)
	}
	for step := range 8 {
		switch step % 4 {
		case 0: // joins
			members = append(members, Member{ID: fmt.Sprintf("instance-%d", next), VirtualNodes: 512})
			next++
		case 1: // leaves
			i := rnd.IntN(len(members))
			members = slices.Delete(members, i, i+1)
		case 2: // changes weight
			members[rnd.IntN(len(members))].VirtualNodes = 1 + rnd.IntN(1024)
		case 3: // one joins as another leaves
			i := rnd.IntN(len(members))
			members = slices.Delete(members, i, i+1)
			members = append(members, Member{ID: fmt.Sprintf("instance-%d", next), VirtualNodes: 700})
			next++
		}
		what := fmt.Sprintf("step %d", step)
		r := derive(what, published[len(published)-1], members)
		// A ring derived from an earlier one, for the same members.
		branch := derive(what+", from an earlier ring", published[rnd.IntN(len(published))], members)
		// The next step derives from the chain's ring, the last.
		mu.Lock()
		published = append(published, branch, r)
		owners = append(owners, lookupAll(branch), lookupAll(r))
		mu.Unlock()
		digests = append(digests, denseDigest(branch), denseDigest(r))
	}
	stop.Store(true)
	readers.Wait()
	for i, r := range published {
		if denseDigest(r) != digests[i] {
			t.Fatalf("ring %d changed after it was published", i)
		}
	}
}

// denseDigest returns a hash of r's slots and chunks: of its owner, point
// and first point for every partition. Like partitionShares, it is not
// instrumented by the race detector: it reads the rings in the test's
// goroutine, while the reader's lookups (instrumented) read them too.
//
//go:norace
func denseDigest(r *denseRing) uint64 {
	h := xxhash.New()
	for _, id := range r.ids {
		_, _ = h.WriteString(id + "\n")
	}
	buf := make([]byte, 0, 4*denseChunkSize+8*len(r.chunks[0].has))
	for _, c := range r.chunks {
		buf = buf[:0]
		for i := range c.owners {
			buf = binary.LittleEndian.AppendUint16(buf, c.owners[i])
			buf = binary.LittleEndian.AppendUint16(buf, c.fine[i])
		}
		for _, w := range c.has {
			buf = binary.LittleEndian.AppendUint64(buf, w)
		}
		_, _ = h.Write(buf)
	}
	return h.Sum64()
}
