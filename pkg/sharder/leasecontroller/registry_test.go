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

	// An instance the ring does not list: the assignment engine decides
	// about it alone; its moves are counted all the same.
	done, ok := r.BeginMove("ring", "unknown")
	if !ok || r.MovesInFlight("ring", "unknown") != 1 {
		t.Errorf("a move away from an unknown instance: began %v, in flight %d", ok, r.MovesInFlight("ring", "unknown"))
	}
	done()
	if n := r.MovesInFlight("ring", "unknown"); n != 0 {
		t.Errorf("in flight: got %d, want 0", n)
	}
}
