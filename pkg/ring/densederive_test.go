package ring

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
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

// compareDense fails unless derived and built are the same ring.
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
	for q := range b.owners {
		if d.owners[q] != b.owners[q] {
			t.Fatalf("%s: partition %d derived to %s, built to %s", what, q, d.memberList[d.owners[q]].ID, b.memberList[b.owners[q]].ID)
		}
	}
	if !slices.Equal(d.hasPoint, b.hasPoint) || !slices.Equal(d.firstPoint, b.firstPoint) {
		t.Fatalf("%s: derived first points differ from those built", what)
	}
}
