package ring_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/sharder-dev/sharder/pkg/ring"
	"github.com/sharder-dev/sharder/pkg/sharder/simulation"
)

var builtins = []string{ring.ConsistentHash, ring.ConsistentHashDense, ring.Rendezvous, ring.HashMod, ring.Range}

func members(prefix string, n, weight int) []ring.Member {
	out := make([]ring.Member, n)
	for i := range out {
		out[i] = ring.Member{ID: fmt.Sprintf("%s-%d", prefix, i), VirtualNodes: weight}
	}
	return out
}

func mustNew(t testing.TB, algorithm string, ms []ring.Member) ring.Ring {
	t.Helper()
	r, err := ring.New(algorithm, ms)
	if err != nil {
		t.Fatalf("New(%q, %d members): %v", algorithm, len(ms), err)
	}
	return r
}

func lookupAll(t testing.TB, r ring.Ring, keys []string) []string {
	t.Helper()
	owners := make([]string, len(keys))
	for i, k := range keys {
		var err error
		if owners[i], err = r.Lookup(k); err != nil {
			t.Fatalf("Lookup(%q): %v", k, err)
		}
	}
	return owners
}

func TestNewAlgorithmNames(t *testing.T) {
	for _, tc := range []struct {
		name    string
		wantErr error
	}{
		{name: ""},
		{name: ring.ConsistentHash},
		{name: ring.ConsistentHashDense},
		{name: ring.Rendezvous},
		{name: ring.HashMod},
		{name: ring.Range},
		{name: "maglev", wantErr: ring.ErrUnknownAlgorithm},
		{name: "Consistent-Hash", wantErr: ring.ErrUnknownAlgorithm},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := ring.New(tc.name, members("op", 3, 16))
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("New(%q) error = %v, want %v", tc.name, err, tc.wantErr)
			}
			if err == nil && r == nil {
				t.Fatal("New returned neither ring nor error")
			}
		})
	}
}

func TestDefaultIsConsistentHash(t *testing.T) {
	keys := simulation.Keys(2000, 3)
	ms := members("op", 5, 64)
	if !slices.Equal(lookupAll(t, mustNew(t, "", ms), keys), lookupAll(t, mustNew(t, ring.ConsistentHash, ms), keys)) {
		t.Fatal(`New("") places keys differently from consistent-hash`)
	}
}

func TestEmptyRing(t *testing.T) {
	for _, alg := range builtins {
		t.Run(alg, func(t *testing.T) {
			for _, ms := range [][]ring.Member{nil, {}} {
				r := mustNew(t, alg, ms)
				if _, err := r.Lookup("g/Kind/ns/name"); !errors.Is(err, ring.ErrNoInstance) {
					t.Fatalf("Lookup on empty ring: error = %v, want ErrNoInstance", err)
				}
				if got := r.Members(); len(got) != 0 {
					t.Fatalf("Members() = %v, want none", got)
				}
			}
		})
	}
}

func TestInvalidMember(t *testing.T) {
	for _, alg := range builtins {
		if _, err := ring.New(alg, []ring.Member{{ID: "a"}, {ID: ""}}); !errors.Is(err, ring.ErrInvalidMember) {
			t.Errorf("%s: New with an empty ID: error = %v, want ErrInvalidMember", alg, err)
		}
	}
}

func TestNormalize(t *testing.T) {
	got, err := ring.Normalize([]ring.Member{
		{ID: "b", VirtualNodes: 3},
		{ID: "a", VirtualNodes: 0},
		{ID: "c", VirtualNodes: -7},
		{ID: "b", VirtualNodes: 9},
		{ID: "d", VirtualNodes: 1 << 40},
		{ID: "b", VirtualNodes: 1},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []ring.Member{{ID: "a", VirtualNodes: 1}, {ID: "b", VirtualNodes: 9}, {ID: "c", VirtualNodes: 1}, {ID: "d", VirtualNodes: ring.MaxWeight}}
	if !slices.Equal(got, want) {
		t.Fatalf("Normalize = %v, want %v", got, want)
	}
}

// The same membership in any order, with duplicates, gives the same ring.
func TestOrderIndependence(t *testing.T) {
	keys := simulation.Keys(3000, 5)
	base := members("op", 12, 0)
	for i := range base {
		base[i].VirtualNodes = 10 + 7*i
	}
	for _, alg := range builtins {
		t.Run(alg, func(t *testing.T) {
			r := mustNew(t, alg, base)
			want := lookupAll(t, r, keys)
			if got := r.Members(); !slices.Equal(got, base[:0:0]) && len(got) != len(base) {
				t.Fatalf("Members() = %v", got)
			}
			rng := rand.New(rand.NewPCG(1, 2))
			for range 5 {
				shuffled := slices.Clone(base)
				shuffled = append(shuffled, shuffled[rng.IntN(len(shuffled))]) // a duplicate
				rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
				other := mustNew(t, alg, shuffled)
				if !slices.Equal(lookupAll(t, other, keys), want) {
					t.Fatal("a shuffled membership with a duplicate places keys differently")
				}
				if !slices.Equal(other.Members(), r.Members()) {
					t.Fatalf("Members() = %v, want %v", other.Members(), r.Members())
				}
			}
		})
	}
}

func TestMembersSortedCopy(t *testing.T) {
	for _, alg := range builtins {
		r := mustNew(t, alg, []ring.Member{{ID: "b", VirtualNodes: 2}, {ID: "a"}})
		got := r.Members()
		want := []ring.Member{{ID: "a", VirtualNodes: 1}, {ID: "b", VirtualNodes: 2}}
		if !slices.Equal(got, want) {
			t.Fatalf("%s: Members() = %v, want %v", alg, got, want)
		}
		got[0].ID = "changed"
		if r.Members()[0].ID != "a" {
			t.Fatalf("%s: Members() returns the ring's own slice", alg)
		}
	}
}

// Every built-in places every key on a member, and every member of a small
// ring gets keys.
func TestLookupCoversMembers(t *testing.T) {
	keys := simulation.Keys(5000, 7)
	for _, alg := range builtins {
		for _, n := range []int{1, 2, 3, 10} {
			t.Run(fmt.Sprintf("%s/%d", alg, n), func(t *testing.T) {
				ms := members("op", n, 128)
				counts := map[string]int{}
				for _, owner := range lookupAll(t, mustNew(t, alg, ms), keys) {
					counts[owner]++
				}
				for _, m := range ms {
					if counts[m.ID] == 0 {
						t.Errorf("member %s got no key", m.ID)
					}
					delete(counts, m.ID)
				}
				if len(counts) != 0 {
					t.Errorf("keys placed on non-members: %v", counts)
				}
			})
		}
	}
}

// Removing an instance moves exactly that instance's keys, and adding one
// moves keys only onto the new instance (consistent-hash,
// consistent-hash-dense and rendezvous).
func TestMinimalMovement(t *testing.T) {
	keys := simulation.Keys(20000, 1)
	for _, alg := range []string{ring.ConsistentHash, ring.ConsistentHashDense, ring.Rendezvous} {
		for _, names := range [][]ring.Member{members("op", 10, 128), members("etcd-operator-7d9f8b6c5d", 10, 64)} {
			t.Run(alg+"/"+names[0].ID, func(t *testing.T) {
				before := lookupAll(t, mustNew(t, alg, names), keys)
				removed := names[3].ID
				after := lookupAll(t, mustNew(t, alg, slices.Delete(slices.Clone(names), 3, 4)), keys)
				for i := range keys {
					if (before[i] != after[i]) != (before[i] == removed) {
						t.Fatalf("removing %s: key %q moved from %s to %s", removed, keys[i], before[i], after[i])
					}
				}
				added := ring.Member{ID: "op-new", VirtualNodes: names[0].VirtualNodes}
				grown := lookupAll(t, mustNew(t, alg, append(slices.Clone(names), added)), keys)
				for i := range keys {
					if before[i] != grown[i] && grown[i] != added.ID {
						t.Fatalf("adding %s: key %q moved from %s to %s", added.ID, keys[i], before[i], grown[i])
					}
				}
			})
		}
	}
}

// A member's weight sets its share of keys.
func TestWeights(t *testing.T) {
	keys := simulation.Keys(30000, 9)
	for _, alg := range builtins {
		t.Run(alg, func(t *testing.T) {
			ms := []ring.Member{{ID: "small", VirtualNodes: 256}, {ID: "big", VirtualNodes: 768}}
			counts := map[string]int{}
			for _, o := range lookupAll(t, mustNew(t, alg, ms), keys) {
				counts[o]++
			}
			share := float64(counts["big"]) / float64(len(keys))
			if share < 0.70 || share > 0.80 {
				t.Fatalf("member of weight 3/4 holds %.3f of the keys (%v)", share, counts)
			}
		})
	}
}

// Ordinal names whose virtual-node names would meet if the ID and the index
// were simply concatenated ("op-1"+"20" and "op-12"+"0") still get their own
// virtual nodes: every one of them owns partitions.
func TestOrdinalNamesDoNotCollide(t *testing.T) {
	ms := members("op", 13, 256)
	counts := map[string]int{}
	for _, o := range lookupAll(t, mustNew(t, ring.ConsistentHash, ms), simulation.Keys(26000, 11)) {
		counts[o]++
	}
	for _, m := range ms {
		if c := counts[m.ID]; c < 1200 || c > 2800 {
			t.Errorf("%s holds %d of 26000 keys, want about 2000", m.ID, c)
		}
	}
}

func TestConsistentHashOptions(t *testing.T) {
	for _, tc := range []struct {
		opts    ring.ConsistentHashOptions
		members int
		wantErr bool
	}{
		{opts: ring.ConsistentHashOptions{}, members: 10},
		{opts: ring.ConsistentHashOptions{PartitionCount: 1}, members: 1},
		{opts: ring.ConsistentHashOptions{PartitionCount: 7}, members: 3},
		{opts: ring.ConsistentHashOptions{PartitionCount: 2}, members: 3, wantErr: true}, // more members than partitions
		{opts: ring.ConsistentHashOptions{PartitionCount: -1}, wantErr: true},
		{opts: ring.ConsistentHashOptions{PartitionCount: 1 << 25}, wantErr: true},
		{opts: ring.ConsistentHashOptions{LoadFactor: 0.5}, wantErr: true},
		{opts: ring.ConsistentHashOptions{LoadFactor: 1}, wantErr: true},
		{opts: ring.ConsistentHashOptions{LoadFactor: 1.25}, members: 10},
		{opts: ring.ConsistentHashOptions{PartitionCount: 97, LoadFactor: 1.01}, members: 40},
		{opts: ring.ConsistentHashOptions{PartitionCount: 10, LoadFactor: 1.0001}, members: 6},
		// Few partitions, a tight bound: the library could run out of room
		// and panic; Build says so instead.
		{opts: ring.ConsistentHashOptions{PartitionCount: 3, LoadFactor: 1.0001}, members: 2, wantErr: true},
	} {
		t.Run(fmt.Sprintf("%+v/%d", tc.opts, tc.members), func(t *testing.T) {
			a, err := ring.NewConsistentHash(tc.opts)
			if err == nil {
				var r ring.Ring
				r, err = a.Build(members("op", tc.members, 1))
				if err == nil {
					_, err = r.Lookup("k")
				}
			}
			if (err != nil) != tc.wantErr {
				t.Fatalf("error = %v, want error: %v", err, tc.wantErr)
			}
		})
	}
}

// Rings too large for the partition table scale weights down rather than
// fail or panic: four members of the largest weight ask for more virtual
// nodes than a ring holds (MaxRingVirtualNodes).
func TestLargeMemberships(t *testing.T) {
	const n = 4
	if n*ring.MaxWeight <= ring.MaxRingVirtualNodes {
		t.Fatalf("%d members of weight %d fit in a ring: the test needs more", n, ring.MaxWeight)
	}
	r := mustNew(t, ring.ConsistentHash, members("op", n, ring.MaxWeight))
	if got := len(r.Members()); got != n {
		t.Fatalf("Members() has %d members, want %d", got, n)
	}
	if _, err := r.Lookup("k"); err != nil {
		t.Fatal(err)
	}
}

func TestRegister(t *testing.T) {
	ring.Register("first-member", ring.AlgorithmFunc(func(ms []ring.Member) (ring.Ring, error) {
		return firstRing(ms), nil
	}))
	ring.Register("broken", ring.AlgorithmFunc(func([]ring.Member) (ring.Ring, error) { panic("boom") }))
	ring.Register("", ring.AlgorithmFunc(nil))
	ring.Register("nil", nil)
	if !slices.Contains(ring.Algorithms(), "first-member") || slices.Contains(ring.Algorithms(), "nil") {
		t.Fatalf("Algorithms() = %v", ring.Algorithms())
	}
	r := mustNew(t, "first-member", []ring.Member{{ID: "b"}, {ID: "a"}, {ID: "a"}})
	if got, _ := r.Lookup("k"); got != "a" {
		t.Fatalf("registered algorithm got members unsorted: Lookup = %q", got)
	}
	if _, err := ring.New("broken", members("op", 2, 1)); err == nil {
		t.Fatal("a panicking algorithm gave no error")
	}
}

type firstRing []ring.Member

func (r firstRing) Lookup(string) (string, error) { return r[0].ID, nil }
func (r firstRing) Members() []ring.Member        { return r }

// Rings are read concurrently without locks (run with -race to check).
func TestConcurrentLookups(t *testing.T) {
	keys := simulation.Keys(2000, 13)
	for _, alg := range builtins {
		r := mustNew(t, alg, members("op", 7, 64))
		want := lookupAll(t, r, keys)
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				for i, k := range keys {
					if got, err := r.Lookup(k); err != nil || got != want[i] {
						t.Errorf("%s: concurrent Lookup(%q) = %q, %v; want %q", alg, k, got, err, want[i])
						return
					}
				}
			})
		}
		wg.Wait()
	}
}
