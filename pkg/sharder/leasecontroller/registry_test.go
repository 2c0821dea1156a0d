package leasecontroller

import (
	"testing"

	"github.com/sharder-dev/sharder/pkg/membership"
)

// TestBeginMove: moves of a gone instance's objects begin only while it is
// movable in the published membership, and count as in flight until they
// return; a membership without the hold refuses new ones but leaves those in
// flight counted.
func TestBeginMove(t *testing.T) {
	r := NewRegistry()
	held := []membership.Member{
		{ID: "a", State: membership.StateDead, Movable: true},
		{ID: "b", State: membership.StateReady},
	}
	r.Set("ring", held)

	if _, ok := r.BeginMove("ring", "b"); ok {
		t.Error("a move away from a ready instance began")
	}
	done1, ok := r.BeginMove("ring", "a")
	if !ok {
		t.Fatal("a move away from a held dead instance was refused")
	}
	done2, ok := r.BeginMove("ring", "a")
	if !ok {
		t.Fatal("a second move was refused")
	}
	if n := r.MovesInFlight("ring", "a"); n != 2 {
		t.Errorf("in flight: got %d, want 2", n)
	}

	released := []membership.Member{
		{ID: "a", State: membership.StateDead},
		{ID: "b", State: membership.StateReady},
	}
	r.Set("ring", released)
	if _, ok := r.BeginMove("ring", "a"); ok {
		t.Error("a move began after the hold ended")
	}
	done1()
	done1() // idempotent
	if n := r.MovesInFlight("ring", "a"); n != 1 {
		t.Errorf("in flight after one returned: got %d, want 1", n)
	}
	done2()
	if n := r.MovesInFlight("ring", "a"); n != 0 {
		t.Errorf("in flight after both returned: got %d, want 0", n)
	}

	// An instance the ring does not list may still be running: refused
	// until the lease controller publishes it and holds it. An ID no Lease
	// can have is gone: its moves begin, counted all the same.
	if _, ok := r.BeginMove("ring", "unknown"); ok {
		t.Error("a move away from an instance that is no member began")
	}
	done, ok := r.BeginMove("ring", "Not_A_Lease")
	if !ok || r.MovesInFlight("ring", "Not_A_Lease") != 1 {
		t.Errorf("a move away from an ID no Lease can have: began %v, in flight %d", ok, r.MovesInFlight("ring", "Not_A_Lease"))
	}
	done()
	if n := r.MovesInFlight("ring", "Not_A_Lease"); n != 0 {
		t.Errorf("in flight: got %d, want 0", n)
	}
}

// TestStranded: counting objects of an instance that is no member, or a
// gone member whose objects cannot move, tells the subscribers once; counts
// of ready or movable members, and counts seen before, tell nothing.
func TestStranded(t *testing.T) {
	r := NewRegistry()
	r.Set("ring", []membership.Member{
		{ID: "dead", State: membership.StateDead},
		{ID: "held", State: membership.StateDead, Movable: true},
		{ID: "ready", State: membership.StateReady},
	})
	var told []string
	r.SubscribeStranded(func(ring string) { told = append(told, ring) })
	r.SetAssigned("ring", map[string]int32{"ready": 3, "held": 2})
	if len(told) != 0 {
		t.Errorf("told %v for a ready and a held member", told)
	}
	r.SetAssigned("ring", map[string]int32{"ready": 3, "held": 2, "ghost": 1})
	if len(told) != 1 {
		t.Errorf("told %v for an instance that is no member, want once", told)
	}
	r.SetAssigned("ring", map[string]int32{"ready": 3, "held": 2, "ghost": 4})
	if len(told) != 1 {
		t.Errorf("told %v again for objects counted before", told)
	}
	r.SetAssigned("ring", map[string]int32{"ready": 3, "dead": 1})
	if len(told) != 2 {
		t.Errorf("told %v for a dead member that is not movable, want a second time", told)
	}
	if got := r.AssignedTo("ring"); len(got) != 2 || got[0] != "dead" || got[1] != "ready" {
		t.Errorf("AssignedTo: %v", got)
	}
}
