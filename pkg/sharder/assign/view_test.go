package assign

import (
	"testing"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/sharder/ringbuilds"
)

func TestDescribeMembershipChange(t *testing.T) {
	ready := func(id string) membership.Member { return membership.Member{ID: id, State: membership.StateReady} }
	for _, tc := range []struct {
		name      string
		prev, cur []membership.Member
		want      string
	}{
		{"none", []membership.Member{ready("a")}, []membership.Member{ready("a")}, ""},
		{"join", []membership.Member{ready("a")}, []membership.Member{ready("a"), ready("b")}, "b joined (ready); 2 of 2 instances ready"},
		{"leave", []membership.Member{ready("a"), ready("b")}, []membership.Member{ready("a")}, "b left; 1 of 1 instances ready"},
		{"state", []membership.Member{ready("a"), ready("b")}, []membership.Member{ready("a"), {ID: "b", State: membership.StateDead}}, "b ready -> dead; 1 of 2 instances ready"},
		{"weight", []membership.Member{ready("a")}, []membership.Member{{ID: "a", State: membership.StateReady, VirtualNodes: 5}}, "a virtual nodes 0 -> 5; 1 of 1 instances ready"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := describeMembershipChange(tc.prev, tc.cur); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestBuildViewReusesRingWhenReadySetUnchanged(t *testing.T) {
	cfg := &ringConfig{name: "r", algorithm: v1alpha1.AlgorithmConsistentHash, virtualNodes: 16}
	rings := &ringbuilds.Builds{}
	m := []membership.Member{{ID: "a", State: membership.StateReady}, {ID: "b", State: membership.StateExpired}}
	_, built, err := buildView(rings, cfg, m)
	if err != nil || !built {
		t.Fatalf("first build: %v, built=%v", err, built)
	}
	// b goes from expired to uncertain: the ready set is the same.
	m2 := []membership.Member{{ID: "a", State: membership.StateReady}, {ID: "b", State: membership.StateUncertain}}
	v2, built, err := buildView(rings, cfg, m2)
	if err != nil || built {
		t.Fatalf("second build: %v, built=%v; want the ring reused", err, built)
	}
	if v2.states["b"].State != membership.StateUncertain {
		t.Errorf("state of b = %s, want uncertain", v2.states["b"].State)
	}
	if id, err := v2.ring.Lookup("k"); err != nil || id != "a" {
		t.Errorf("Lookup = %q, %v; want a (the only ready instance)", id, err)
	}
	m3 := []membership.Member{{ID: "a", State: membership.StateReady}, {ID: "b", State: membership.StateReady}}
	if _, built, _ := buildView(rings, cfg, m3); !built {
		t.Error("ring not rebuilt when b became ready")
	}
}
