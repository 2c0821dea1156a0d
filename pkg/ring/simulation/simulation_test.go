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
