package assign

import (
	"time"

	"github.com/sharder-dev/sharder/pkg/membership"
)

// action is what the sharder does with a main object (docs/design.md §5).
type action int

const (
	// actionKeep: the object is on the instance it belongs to.
	actionKeep action = iota
	// actionAssign: the object is unassigned (new, or its drain was
	// acknowledged): label it for the target.
	actionAssign
	// actionRelabelGone: its instance is gone (dead, orphaned, or unknown
	// past the hold for unknown instances) and the sharder holds its Lease:
	// relabel it at once, without a drain; nobody is left to race with, and
	// nobody can come back while the hold lasts.
	actionRelabelGone
	// actionRequestDrain: its ready instance must let go first.
	actionRequestDrain
	// actionWait: a drain is in flight; decide again at the deadline.
	actionWait
	// actionForce: the drain was not acknowledged in time: release the
	// object from its instance (remove the shard label, keep the drain
	// label), so that the instance drops it and cancels its reconciles.
	actionForce
	// actionWithdraw: the object belongs to its instance again while a
	// drain is requested: remove the drain label.
	actionWithdraw
	// actionHold: its instance may still be working (expired, uncertain,
	// vanished) or no instance is ready: nothing moves.
	actionHold
	// actionAssignForced: the object was released by a forced move at
	// least its release grace ago (ForceGrace plus its old instance's
	// promised watch lag and bound on stopping): label it for the target.
	actionAssignForced
	// actionRetarget: a drain in flight names an instance that is no longer
	// the target: make it name the target, so that the acknowledgement
	// hands the object over to the right instance. The drain keeps its
	// start and its deadline.
	actionRetarget
)

// ForceGrace is how long a forced move leaves an object with no instance
// between releasing it from the instance that did not acknowledge its drain
// (counted from when the sharder saw its release written) and assigning it
// to the next one, besides the watch lag and the bound on stopping the
// instance promises on its Lease (membership.Member.MaxWatchLag and
// MaxStop). The released instance sees the object leave its cache within
// that lag, or has stopped reconciling because its watch fell further
// behind (pkg/instance), and cancels its reconciles of it meanwhile, which
// return within its bound on stopping or its process exits, so they end
// before the next instance starts on it. An instance that promises nothing
// (sharder agent) gets ForceGrace only: its controller's watch must not be
// further behind than that, nor its reconciles run on longer.
const ForceGrace = 2 * time.Second

var actionNames = [...]string{"keep", "assign", "relabel-gone", "request-drain", "wait", "force", "withdraw", "hold", "assign-forced", "retarget"}

func (a action) String() string { return actionNames[a] }

// urgent reports whether the action waits for nothing but the sharder.
func (a action) urgent() bool {
	return a == actionAssign || a == actionRelabelGone || a == actionAssignForced
}

// situation is what the decision about one main object depends on.
type situation struct {
	// current is the instance the shard label names; empty when unassigned.
	current string
	// target is the instance the ring maps the object to; empty when no
	// instance is ready.
	target string
	// currentPromise is the watch lag and the bound on stopping current
	// promises, summed (promiseOf).
	currentPromise time.Duration
	// state is current's state. An instance the sharder does not know is
	// passed as vanished while the hold for unknown instances lasts
	// (heldUntil), and as dead after it.
	state membership.State
	// heldUntil is when the hold of an unknown instance ends; zero otherwise.
	heldUntil time.Time
	// movable reports, when current is gone, whether its objects may move
	// now: the sharder holds its Lease, or it has none to hold
	// (membership.Member.Movable).
	movable bool
	// draining reports whether the object carries the drain label.
	draining bool
	// drainTarget is the instance the drain label names (drain.Target);
	// empty when it names none.
	drainTarget string
	// drainStarted is when the drain began: as the sharder recorded it, or
	// as the sharder that requested it wrote it on the object
	// (ringAssigner.drainStarted); zero when neither did (a drain requested
	// by a sharder that wrote no start).
	drainStarted time.Time
	// releasedAt, for an object released by a forced move (no shard label,
	// a drain label), is when the sharder saw the release written, and
	// releaseGrace how long after that it is assigned.
	releasedAt   time.Time
	releaseGrace time.Duration
	drainTimeout time.Duration
	now          time.Time
}

// drainStartedOrNow is when the drain began, now for a drain with no
// recorded start (which gets a full timeout) or one requested now.
func (s situation) drainStartedOrNow() time.Time {
	if s.drainStarted.IsZero() {
		return s.now
	}
	return s.drainStarted
}

// decision is an action and, for actionWait and a timed actionHold, when
// to decide again.
type decision struct {
	action action
	at     time.Time
}

// decide is the assignment decision for one main object. It is a pure
// function of the situation: the sharder's reconcile acts on it, the
// rebalancing summary counts with it, and the work queue asks it which
// objects are urgent.
func decide(s situation) decision {
	switch {
	case s.target == "":
		return decision{action: actionHold} // no ready instance: nothing is assigned, nothing moves
	case s.current == "" && s.draining:
		// Released by a forced move: assigned once its old instance had the
		// release grace to let go, counted from the release as the sharder
		// saw it land, not from the drain's deadline: a release retried
		// through errors may land late.
		if at := s.releasedAt.Add(s.releaseGrace); s.now.Before(at) {
			return decision{action: actionWait, at: at}
		}
		return decision{action: actionAssignForced}
	case s.current == "":
		return decision{action: actionAssign}
	case s.current == s.target && s.draining:
		return decision{action: actionWithdraw}
	case s.current == s.target:
		return decision{action: actionKeep}
	case s.state.Gone() && s.movable:
		return decision{action: actionRelabelGone}
	case s.state.Gone():
		// Until the sharder holds the instance's Lease, the instance could
		// take it back and start on the object: nothing moves. The hold
		// changes the membership, which decides again.
		return decision{action: actionHold}
	case s.state.Ready() && !s.draining:
		return decision{action: actionRequestDrain}
	case s.state.Ready():
		deadline := s.drainStartedOrNow().Add(s.drainTimeout)
		switch {
		case !s.now.Before(deadline):
			return decision{action: actionForce}
		case s.drainTarget != "" && s.drainTarget != s.target:
			return decision{action: actionRetarget, at: deadline}
		}
		return decision{action: actionWait, at: deadline}
	}
	return decision{action: actionHold, at: s.heldUntil}
}
