package membership

import "time"

// State is the state of an instance as the sharder computes it from its
// Lease (docs/design.md §3).
type State string

const (
	// StateReady: the instance renews its Lease; it receives objects.
	StateReady State = "ready"
	// StateExpired: the Lease was not renewed within its duration. The
	// instance may still be working: it keeps its objects and gets no new
	// ones.
	StateExpired State = "expired"
	// StateUncertain: not renewed for twice its duration. The sharder tries
	// to take the Lease to prove the instance gone; until then the instance
	// keeps its objects.
	StateUncertain State = "uncertain"
	// StateDead: the Lease was released or taken. The instance is gone: its
	// objects move at once, without a drain.
	StateDead State = "dead"
	// StateOrphaned: dead for ten lease durations; the sharder deletes the
	// Lease.
	StateOrphaned State = "orphaned"
	// StateVanished: the instance's Lease was deleted or left the ring
	// (its sharder.dev/ring label changed, or the ring's leaseNamespace did)
	// without being released or taken. Nothing proves the instance gone: it
	// is held like an expired one until twice its last seen lease duration
	// has passed since its last seen renewal, and is gone after that.
	StateVanished State = "vanished"
	// StateRestarting: the instance handed its Lease back because it is
	// restarting with the same ID (a StatefulSet's pod): the Lease has no
	// holder and the sharder.dev/restarting annotation. For the ring's
	// restartHold after the sharder saw that, the instance keeps its
	// objects and gets no new ones; the next process with the same ID
	// acquires the Lease at once and resumes. Then it is dead.
	StateRestarting State = "restarting"
	// StateInvalid: the Lease cannot be handled (its name is not a valid
	// instance ID, see InvalidID). It never receives objects.
	StateInvalid State = "invalid"
)

// States lists every state in the order of an instance's life.
var States = []State{StateReady, StateRestarting, StateExpired, StateUncertain, StateVanished, StateDead, StateOrphaned, StateInvalid}

// Ready reports whether an instance in state s may receive objects: only a
// ready instance is on the ring.
func (s State) Ready() bool { return s == StateReady }

// Gone reports whether an instance in state s is proven gone, so that its
// objects move at once without a drain. Every other state that is not
// ready holds the instance's objects where they are.
func (s State) Gone() bool { return s == StateDead || s == StateOrphaned }

// Member is one instance of a ring as the sharder sees it.
type Member struct {
	// ID is the instance ID (= Lease name = holder identity).
	ID string
	// VirtualNodes is the weight from the Lease's sharder.dev/virtual-nodes
	// label; 0 means the ring's default.
	VirtualNodes int
	// State is the instance's current state.
	State State
	// Movable reports, for an instance that is gone, whether its objects
	// may be relabelled to other instances now: the sharder holds its Lease
	// (so no process with its ID can acquire the Lease while they move),
	// whatever way the instance went: the sharder creates the Lease of an
	// instance whose Lease is absent, and takes one somebody else holds,
	// before it moves anything. The objects of a gone instance that is not
	// movable stay where they are until the sharder holds its Lease
	// (docs/design.md §3). Always false for an instance not gone.
	Movable bool
	// MaxWatchLag is the lag of its watches the instance promises with its
	// Lease's sharder.dev/max-watch-lag annotation: it reconciles nothing
	// on a view of the API server older than this. 0: no promise (the
	// annotation is absent or malformed). The sharder waits this much
	// longer before assigning an object it released from the instance by a
	// forced move (docs/design.md §5).
	MaxWatchLag time.Duration
	// MaxStop is the bound on stopping the instance promises with its
	// Lease's sharder.dev/max-stop annotation: every reconcile it cancels
	// because it may no longer act returns within this much, or its process
	// exits. 0: no promise beyond the Lease's margin (the annotation is
	// absent or malformed). The sharder waits this much longer before
	// another instance gets an object the instance may still be working on
	// (docs/design.md §3, §5, §11).
	MaxStop time.Duration
}

// Weight returns m's number of virtual nodes: its own, else ringDefault.
func (m Member) Weight(ringDefault int) int {
	if m.VirtualNodes > 0 {
		return m.VirtualNodes
	}
	return ringDefault
}
