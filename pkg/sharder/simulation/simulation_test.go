package simulation

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func TestIdealMovedFraction(t *testing.T) {
	for _, tc := range []struct {
		n, add, remove int
		want           float64
	}{
		{10, 1, 0, 1.0 / 11},
		{10, 0, 1, 0.1},
		{4, 4, 0, 0.5},
		{5, 0, 2, 0.4},
		{10, 1, 1, 0.1}, // replace one: its keys move, nothing else must
		{3, 0, 0, 0},
		{0, 1, 0, 0},
	} {
		if got := IdealMovedFraction(tc.n, tc.add, tc.remove); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("IdealMovedFraction(%d, %d, %d) = %v, want %v", tc.n, tc.add, tc.remove, got, tc.want)
		}
	}
}

func TestValidate(t *testing.T) {
	keys := []string{"k"}
	for _, tc := range []struct {
		opts Options
		want string
	}{
		{Options{Instances: 0, Keys: keys}, "instances must be at least 1"},
		{Options{Instances: 2}, "no keys"},
		{Options{Instances: 2, Keys: keys, Names: "daemonset"}, "instance names"},
		{Options{Instances: 2, Keys: keys, VirtualNodes: -1}, "virtual nodes"},
		{Options{Instances: 2, Keys: keys, Add: -1}, "negative"},
		{Options{Instances: 2, Keys: keys, Remove: 2}, "at least one must remain"},
		{Options{Instances: 2, Keys: keys, Remove: 1, Add: 3}, ""},
	} {
		err := tc.opts.Validate()
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("Validate(%+v) = %v, want %q", tc.opts, err, tc.want)
		}
	}
}

func TestGeneratorsAreDeterministic(t *testing.T) {
	if !slices.Equal(Keys(500, 3), Keys(500, 3)) || slices.Equal(Keys(500, 3), Keys(500, 4)) {
		t.Fatal("Keys is not a function of its seed")
	}
	keys := Keys(2000, 1)
	if got := len(slices.Compact(slices.Sorted(slices.Values(keys)))); got != 2000 {
		t.Fatalf("Keys returned %d distinct keys of 2000", got)
	}
	a := InstanceNames(Deployment, "web", 30, rand.New(rand.NewPCG(1, 1)))
	b := InstanceNames(Deployment, "web", 30, rand.New(rand.NewPCG(1, 1)))
	if !slices.Equal(a, b) || len(slices.Compact(slices.Sorted(slices.Values(a)))) != 30 {
		t.Fatalf("deployment names not deterministic or not distinct: %v", a)
	}
	if got := InstanceNames(StatefulSet, "db", 3, nil); !slices.Equal(got, []string{"db-0", "db-1", "db-2"}) {
		t.Fatalf("statefulset names = %v", got)
	}
}

// Replacing an instance (add one, remove one) under rendezvous moves only
// keys of the removed instance and keys the added instance takes.
func TestRunReplace(t *testing.T) {
	res, err := Run(Options{Algorithm: "rendezvous", Instances: 6, Add: 1, Remove: 1, Keys: Keys(6000, 2)})
	if err != nil {
		t.Fatal(err)
	}
	var removed int
	for _, in := range res.Instances {
		if in.State == "removed" {
			removed += in.Keys
		}
	}
	var added int
	for _, in := range res.After {
		if in.State == "added" {
			added += in.Keys
		}
	}
	if res.Moved < max(removed, added) || res.Moved > removed+added {
		t.Fatalf("moved %d keys; the removed instance held %d, the added one holds %d", res.Moved, removed, added)
	}
	if math.Abs(res.IdealMovedFraction-1.0/6) > 1e-12 || res.MovedFraction < res.IdealMovedFraction {
		t.Fatalf("movedFraction %v, idealMovedFraction %v (want 1/6)", res.MovedFraction, res.IdealMovedFraction)
	}
	if len(res.Instances) != 6 || len(res.After) != 6 || res.Instances[5].ID != "instance-5" {
		t.Fatalf("instances %v, after %v", res.Instances, res.After)
	}
}

// Mixed weights: over-mean figures compare each instance with its own fair
// share, and the ideal counts the weight of the instance added.
func TestRunWeights(t *testing.T) {
	res, err := Run(Options{Algorithm: "rendezvous", Instances: 3, Weights: []int{100, 300}, Add: 1, Keys: Keys(20000, 4)})
	if err != nil {
		t.Fatal(err)
	}
	want := []int{100, 300, 100}
	for i, in := range res.Instances {
		if in.VirtualNodes != want[i] {
			t.Fatalf("instance %s has weight %d, want %d", in.ID, in.VirtualNodes, want[i])
		}
	}
	if res.MaxOverMean > 1.05 || res.MinOverMean < 0.95 {
		t.Fatalf("max/min over the fair share %.3f/%.3f, want close to 1", res.MaxOverMean, res.MinOverMean)
	}
	// The 4th instance (weight 300) joins a total of 500: the ideal is 3/8.
	if math.Abs(res.IdealMovedFraction-300.0/800) > 1e-12 || math.Abs(res.MovedOverIdeal-res.MovedFraction/res.IdealMovedFraction) > 1e-12 {
		t.Fatalf("idealMovedFraction %v (want 3/8), movedOverIdeal %v", res.IdealMovedFraction, res.MovedOverIdeal)
	}
	if res.BuildSeconds <= 0 {
		t.Fatalf("buildSeconds = %v", res.BuildSeconds)
	}
	if err := (Options{Instances: 2, Keys: []string{"k"}, Weights: []int{1, 0}}).Validate(); err == nil {
		t.Fatal("a weight of 0 passed validation")
	}
}

// Equal weights give the same ideal as IdealMovedFraction.
func TestIdealMovedFractionWeighted(t *testing.T) {
	ids := InstanceNames(StatefulSet, "i", 12, nil)
	weights := map[string]int{}
	for _, id := range ids {
		weights[id] = 7
	}
	for _, tc := range []struct{ n, add, remove int }{{10, 1, 0}, {10, 0, 1}, {4, 2, 1}, {10, 2, 3}} {
		before, after := ids[:tc.n], append(slices.Clone(ids[tc.remove:tc.n]), ids[tc.n:tc.n+tc.add]...)
		if got, want := idealMovedFraction(before, after, weights), IdealMovedFraction(tc.n, tc.add, tc.remove); math.Abs(got-want) > 1e-12 {
			t.Errorf("%+v: weighted ideal %v, want %v", tc, got, want)
		}
	}
}

func TestSweep(t *testing.T) {
	keys := Keys(4*500, 6)
	sizes, err := Sweep(Options{Algorithm: "rendezvous", Keys: keys}, []int{1, 2, 4}, 500)
	if err != nil {
		t.Fatal(err)
	}
	if len(sizes) != 3 || sizes[0].Keys != 500 || sizes[2].Keys != 2000 || sizes[2].Instances != 4 {
		t.Fatalf("sizes = %+v", sizes)
	}
	if sizes[0].RemoveMovedOverIdeal != 0 || sizes[2].RemoveMovedOverIdeal < 0.9 || sizes[2].AddMovedOverIdeal < 0.8 || sizes[2].AddMovedOverIdeal > 1.2 {
		t.Fatalf("moved over ideal: %+v", sizes)
	}
	for _, bad := range [][]int{nil, {0, 2}, {5}} {
		if _, err := Sweep(Options{Keys: keys}, bad, 500); err == nil {
			t.Errorf("Sweep(%v) gave no error", bad)
		}
	}
}
