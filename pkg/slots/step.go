package slots

import (
	"slices"
	"time"

	"github.com/sharder-dev/sharder/pkg/membership"
)

// Action is what the sharder does with one slot (docs/design.md §11).
type Action int

const (
	// Keep: the slot is granted to the instance it belongs to.
	Keep Action = iota
	// Grant: the slot is unassigned: grant it to its target.
	Grant
	// Release: the slot is granted to a ready instance it no longer
	// belongs to: mark it releasing, so that the instance lets go and
	// acknowledges.
	Release
	// Wait: the slot is releasing and not acknowledged yet; decide again at
	// the deadline (drainTimeout after the sharder saw the release written).
	Wait
	// Withdraw: the slot is releasing from the instance it belongs to
	// again: granted to it again.
	Withdraw
	// GrantAcknowledged: its holder acknowledged the release: grant it to
	// its target.
	GrantAcknowledged
	// Fence: its ready holder did not acknowledge the release in time:
	// fence the holder (take its Lease); the slot stays until the holder
	// is gone and movable.
	Fence
	// GrantGone: its holder is gone (dead, orphaned) and movable (the
	// sharder holds its Lease, or a fenced holder's wait is over): grant it
	// to its target at once, without a release.
	GrantGone
	// Hold: nothing moves: its holder may still be working (expired,
	// uncertain, vanished, restarting, or unknown), is gone but not movable
	// yet, or no instance is ready to take the slot.
	Hold
)

var actionNames = [...]string{"keep", "grant", "release", "wait", "withdraw", "grant-acknowledged", "fence", "grant-gone", "hold"}

func (a Action) String() string { return actionNames[a] }

// Instance is what Step knows of an instance of the ring.
type Instance struct {
	// State is its state (membership.StateOf): only ready instances are
	// granted slots; only gone ones lose them without acknowledging.
	State membership.State
	// Weight is its weight (virtual nodes); less than 1 counts as 1.
	Weight int
	// Movable reports, for a gone instance, whether its slots may be
	// granted to others now: the sharder holds its Lease, or there is no
	// Lease to hold, and, when the sharder fenced it, one lease duration of
	// the instance has passed since the takeover (membership.Member.Movable
	// plus the fence's wait).
	Movable bool
	// Acknowledged is the table revision the instance acknowledged on its
	// Lease for this ring (sharder.dev/slots-acknowledged with the ring's
	// UID); 0 when it acknowledged nothing.
	Acknowledged int64
}

// Input is what Step decides from besides the table.
type Input struct {
	// Instances are the ring's instances by ID: every instance with a
	// Lease, and every holder of a slot without one, passed as vanished
	// while the sharder's hold of unknown instances lasts and as dead and
	// movable after it. A holder missing from Instances keeps its slots.
	Instances map[string]Instance
	// ReleasesSeen is when the sharder saw the table write of each
	// revision that asked for releases land. A revision missing counts from
	// Now: the caller records each revision when it first sees it, so that
	// a release written before a new leader started gets a full timeout.
	ReleasesSeen map[int64]time.Time
	// DrainTimeout is the ring's drainTimeout: how long a release waits for
	// its acknowledgement before the holder is fenced.
	DrainTimeout time.Duration
	// Now is the time of the decision, on the sharder's clock.
	Now time.Time
}

// Result is the outcome of Step.
type Result struct {
	// Table is the next table: Revision + 1 when Changed, the same table
	// otherwise. Slots marked releasing by this step have Since = its
	// revision.
	Table Table
	// Changed reports whether the table must be written.
	Changed bool
	// Actions are the actions by slot.
	Actions []Action
	// Fence are the ready instances to fence, sorted.
	Fence []string
	// Next is the earliest time a Wait ends: decide again then, if nothing
	// else changed before; zero when nothing waits.
	Next time.Time
}

// Step is the table's state machine: from the table and the ring's
// instances it decides every slot and returns the next table. It is a pure
// function: the sharder writes the result's table, locked on the
// resourceVersion of the ring it read the table from, fences the instances
// it names, and steps again when the table, an instance or the time
// changes.
//
// What it guarantees, whatever the input: a slot held by an instance
// passes to another only when the holder acknowledged a revision at least
// the one that asked for its release, or the holder is gone and movable; a
// ready holder is fenced only past the drain timeout of a release it did
// not acknowledge; and a slot is granted only to a ready instance.
func Step(t Table, in Input) Result {
	next := t.Clone()
	next.Revision = t.Revision + 1
	res := Result{Table: t, Actions: make([]Action, len(t.Slots))}

	var members []Member
	for id, inst := range in.Instances {
		if inst.State.Ready() {
			members = append(members, Member{ID: id, Weight: inst.Weight})
		}
	}
	targets := Plan(t.Holders(), members)

	changed := false
	fence := map[string]bool{}
	for i, s := range t.Slots {
		inst, known := in.Instances[s.Holder]
		seen, ok := in.ReleasesSeen[s.Since]
		if !ok {
			seen = in.Now
		}
		d := decide(situation{
			slot:         s,
			target:       targets[i],
			known:        known,
			holder:       inst,
			releaseSeen:  seen,
			drainTimeout: in.DrainTimeout,
			now:          in.Now,
		})
		res.Actions[i] = d.action
		switch d.action {
		case Grant, GrantAcknowledged, GrantGone, Withdraw:
			next.Slots[i] = Slot{Holder: targets[i]}
			changed = true
		case Release:
			next.Slots[i] = Slot{Holder: s.Holder, Releasing: true, Since: next.Revision}
			changed = true
		case Fence:
			fence[s.Holder] = true
		case Wait:
			if res.Next.IsZero() || d.at.Before(res.Next) {
				res.Next = d.at
			}
		}
	}
	if changed {
		res.Table, res.Changed = next, true
	}
	for id := range fence {
		res.Fence = append(res.Fence, id)
	}
	slices.Sort(res.Fence)
	return res
}

// situation is what the decision about one slot depends on.
type situation struct {
	slot Slot
	// target is where Plan puts the slot: a ready instance, or "" when none
	// is ready.
	target string
	// known reports whether the holder is among the instances; holder is
	// what is known of it.
	known  bool
	holder Instance
	// releaseSeen is when the sharder saw the release of the slot written.
	releaseSeen  time.Time
	drainTimeout time.Duration
	now          time.Time
}

// decision is an action and, for Wait, when it ends.
type decision struct {
	action Action
	at     time.Time
}

// decide is the decision about one slot, a pure function of its situation.
func decide(s situation) decision {
	switch {
	case s.slot.Holder == "" && s.target == "":
		return decision{action: Hold}
	case s.slot.Holder == "":
		return decision{action: Grant}
	case s.slot.Releasing && s.known && s.holder.Acknowledged >= s.slot.Since:
		// The holder let go: the acknowledgement is a fact whatever its
		// state is now.
		switch s.target {
		case "":
			return decision{action: Hold}
		case s.slot.Holder:
			return decision{action: Withdraw}
		}
		return decision{action: GrantAcknowledged}
	case !s.known:
		return decision{action: Hold}
	case s.holder.State.Gone() && s.holder.Movable && s.target != "":
		return decision{action: GrantGone}
	case !s.holder.State.Ready():
		// Expired, uncertain, vanished, restarting or invalid: it may still
		// be working. Gone but not movable: until the sharder holds its
		// Lease (or a fence's wait is over) it could come back.
		return decision{action: Hold}
	case s.slot.Holder == s.target && s.slot.Releasing:
		return decision{action: Withdraw}
	case s.slot.Holder == s.target:
		return decision{action: Keep}
	case !s.slot.Releasing:
		return decision{action: Release}
	}
	deadline := s.releaseSeen.Add(s.drainTimeout)
	if s.now.Before(deadline) {
		return decision{action: Wait, at: deadline}
	}
	return decision{action: Fence}
}
