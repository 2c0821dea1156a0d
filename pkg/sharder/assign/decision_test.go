package assign

import (
	"testing"
	"time"

	"github.com/sharder-dev/sharder/pkg/membership"
)

func TestDecide(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	timeout := 30 * time.Second
	for _, tc := range []struct {
		name string
		s    situation
		want decision
	}{
		{"no ready instance, unassigned", situation{}, decision{action: actionHold}},
		{"no ready instance, assigned to an expired one", situation{current: "a", state: membership.StateExpired}, decision{action: actionHold}},
		{"no ready instance, assigned to a dead one", situation{current: "a", state: membership.StateDead}, decision{action: actionHold}},
		{"new object", situation{target: "b"}, decision{action: actionAssign}},
		{"drain acknowledged", situation{target: "b", drainStarted: now.Add(-time.Second)}, decision{action: actionAssign}},
		{"in place", situation{current: "b", target: "b", state: membership.StateReady}, decision{action: actionKeep}},
		{"back in place while draining", situation{current: "b", target: "b", state: membership.StateReady, draining: true}, decision{action: actionWithdraw}},
		{"from a dead instance", situation{current: "a", target: "b", state: membership.StateDead, movable: true}, decision{action: actionRelabelGone}},
		{"from a dead instance whose Lease the sharder does not hold yet", situation{current: "a", target: "b", state: membership.StateDead},
			decision{action: actionHold}},
		{"from an orphaned instance", situation{current: "a", target: "b", state: membership.StateOrphaned, movable: true}, decision{action: actionRelabelGone}},
		{"from a dead instance while draining", situation{current: "a", target: "b", state: membership.StateDead, movable: true, draining: true},
			decision{action: actionRelabelGone}},
		{"from a restarting instance", situation{current: "a", target: "b", state: membership.StateRestarting}, decision{action: actionHold}},
		{"from a ready instance", situation{current: "a", target: "b", state: membership.StateReady, drainTimeout: timeout, now: now}, decision{action: actionRequestDrain}},
		{"drain in flight", situation{current: "a", target: "b", state: membership.StateReady, draining: true,
			drainStarted: now.Add(-10 * time.Second), drainTimeout: timeout, now: now}, decision{action: actionWait, at: now.Add(20 * time.Second)}},
		{"drain from before a restart", situation{current: "a", target: "b", state: membership.StateReady, draining: true,
			drainTimeout: timeout, now: now}, decision{action: actionWait, at: now.Add(timeout)}},
		{"drain timed out", situation{current: "a", target: "b", state: membership.StateReady, draining: true,
			drainStarted: now.Add(-timeout), drainTimeout: timeout, now: now}, decision{action: actionForce}},
		{"released by a forced move, within the grace", situation{target: "b", draining: true,
			drainStarted: now.Add(-timeout), releasedAt: now, releaseGrace: ForceGrace, drainTimeout: timeout, now: now},
			decision{action: actionWait, at: now.Add(ForceGrace)}},
		{"released by a forced move, after the grace", situation{target: "b", draining: true,
			drainStarted: now.Add(-timeout - ForceGrace), releasedAt: now.Add(-ForceGrace), releaseGrace: ForceGrace, drainTimeout: timeout, now: now},
			decision{action: actionAssignForced}},
		// A release retried through errors landed long after the drain's
		// deadline: the grace counts from the release, not the deadline.
		{"released late by a forced move, within the grace", situation{target: "b", draining: true,
			drainStarted: now.Add(-timeout - ForceGrace), releasedAt: now.Add(-time.Second), releaseGrace: ForceGrace, drainTimeout: timeout, now: now},
			decision{action: actionWait, at: now.Add(ForceGrace - time.Second)}},
		// The old instance promised a watch lag: it may act on a view that
		// old, so the grace is longer by that much.
		{"released by a forced move from an instance promising a watch lag", situation{target: "b", draining: true,
			drainStarted: now.Add(-timeout - ForceGrace), releasedAt: now.Add(-ForceGrace), releaseGrace: ForceGrace + 10*time.Second,
			drainTimeout: timeout, now: now}, decision{action: actionWait, at: now.Add(10 * time.Second)}},
		{"released by a forced move, no ready instance", situation{draining: true, drainTimeout: timeout, now: now}, decision{action: actionHold}},
		{"from an expired instance", situation{current: "a", target: "b", state: membership.StateExpired}, decision{action: actionHold}},
		{"from an uncertain instance while draining", situation{current: "a", target: "b", state: membership.StateUncertain, draining: true}, decision{action: actionHold}},
		{"from a vanished instance", situation{current: "a", target: "b", state: membership.StateVanished}, decision{action: actionHold}},
		{"from an unknown instance during the hold", situation{current: "a", target: "b", state: membership.StateVanished,
			heldUntil: now.Add(time.Minute), now: now}, decision{action: actionHold, at: now.Add(time.Minute)}},
		{"drain in flight naming the target", situation{current: "a", target: "b", state: membership.StateReady, draining: true, drainTarget: "b",
			drainStarted: now.Add(-10 * time.Second), drainTimeout: timeout, now: now}, decision{action: actionWait, at: now.Add(20 * time.Second)}},
		{"drain in flight naming an instance that is no longer the target", situation{current: "a", target: "b", state: membership.StateReady,
			draining: true, drainTarget: "c", drainStarted: now.Add(-10 * time.Second), drainTimeout: timeout, now: now},
			decision{action: actionRetarget, at: now.Add(20 * time.Second)}},
		{"drain from before a restart naming an instance that is no longer the target", situation{current: "a", target: "b",
			state: membership.StateReady, draining: true, drainTarget: "c", drainTimeout: timeout, now: now},
			decision{action: actionRetarget, at: now.Add(timeout)}},
		{"drain naming an instance that is no longer the target, timed out", situation{current: "a", target: "b", state: membership.StateReady,
			draining: true, drainTarget: "c", drainStarted: now.Add(-timeout), drainTimeout: timeout, now: now}, decision{action: actionForce}},
		{"back in place while a drain names another instance", situation{current: "a", target: "a", state: membership.StateReady,
			draining: true, drainTarget: "c"}, decision{action: actionWithdraw}},
		{"released by a forced move, its drain naming an instance that is no longer the target", situation{target: "b", draining: true,
			drainTarget: "c", drainStarted: now.Add(-timeout - ForceGrace), releasedAt: now.Add(-ForceGrace), releaseGrace: ForceGrace,
			drainTimeout: timeout, now: now}, decision{action: actionAssignForced}},
		// The acknowledgement hands the object over to the instance the drain
		// names; the sharder takes it from there like any other object.
		{"handed over to its target", situation{current: "c", target: "c", state: membership.StateReady, drainTimeout: timeout, now: now},
			decision{action: actionKeep}},
		{"handed over to a ready instance that is no longer its target", situation{current: "c", target: "b", state: membership.StateReady,
			drainTimeout: timeout, now: now}, decision{action: actionRequestDrain}},
		{"handed over to an instance that died meanwhile", situation{current: "c", target: "b", state: membership.StateDead, movable: true,
			drainTimeout: timeout, now: now}, decision{action: actionRelabelGone}},
		{"handed over to an instance that expired meanwhile", situation{current: "c", target: "b", state: membership.StateExpired,
			drainTimeout: timeout, now: now}, decision{action: actionHold}},
		{"handed over to an instance the sharder does not know, during the hold", situation{current: "c", target: "b",
			state: membership.StateVanished, heldUntil: now.Add(time.Minute), now: now}, decision{action: actionHold, at: now.Add(time.Minute)}},
		{"acknowledged the old way: both labels removed", situation{target: "c", drainStarted: now.Add(-time.Second), drainTimeout: timeout, now: now},
			decision{action: actionAssign}},
		{"from an invalid instance", situation{current: "a", target: "b", state: membership.StateInvalid}, decision{action: actionHold}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := decide(tc.s); got != tc.want {
				t.Errorf("decide() = %v at %v, want %v at %v", got.action, got.at, tc.want.action, tc.want.at)
			}
		})
	}
}

// TestRingViewStateOf checks the states of members and of instances that
// are not members: held until the lease controller publishes them, unless
// no Lease can have their name.
func TestRingViewStateOf(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	v := &ringView{states: map[string]membership.Member{
		"a": {ID: "a", State: membership.StateExpired},
		"d": {ID: "d", State: membership.StateDead},
		"h": {ID: "h", State: membership.StateDead, Movable: true},
	}}
	if s, movable, until := v.stateOf("a", now); s != membership.StateExpired || movable || !until.IsZero() {
		t.Errorf("member: %s (movable %v) until %v", s, movable, until)
	}
	if s, movable, _ := v.stateOf("d", now); s != membership.StateDead || movable {
		t.Errorf("dead member whose Lease is not held: %s, movable %v; want dead and not movable", s, movable)
	}
	if s, movable, _ := v.stateOf("h", now); s != membership.StateDead || !movable {
		t.Errorf("dead member whose Lease is held: %s, movable %v; want dead and movable", s, movable)
	}
	for _, at := range []time.Time{now, now.Add(time.Hour)} {
		if s, movable, until := v.stateOf("x", at); s != membership.StateVanished || movable || !until.IsZero() {
			t.Errorf("unknown instance at %v: %s (movable %v) until %v; want vanished, not movable, until the membership changes", at, s, movable, until)
		}
	}
	if s, movable, _ := v.stateOf("Not_A_Lease", now); s != membership.StateDead || !movable {
		t.Errorf("an ID no Lease can have: %s (movable %v), want dead and movable", s, movable)
	}
}
