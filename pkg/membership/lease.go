package membership

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// Timing constants of the protocol (docs/design.md §3). All are multiples of the
// Lease's own leaseDurationSeconds (d).
const (
	// DefaultLeaseDuration is the lease duration of the instance holder, and
	// the duration assumed for a Lease whose leaseDurationSeconds is missing
	// or not positive.
	DefaultLeaseDuration = 15 * time.Second
	// DefaultRenewPeriod is how often the instance holder renews with the
	// default lease duration (a third of it).
	DefaultRenewPeriod = 5 * time.Second
	// MaxLeaseDuration bounds the duration StateOf assumes: a Lease asking
	// for more counts as holding for MaxLeaseDuration.
	MaxLeaseDuration = 24 * time.Hour
	// DefaultWriteTimeout is the default deadline of the sharder's writes
	// that move work (label writes, slot table writes), which the API
	// server enforces: a write lands within it or not at all. The lease
	// controller keeps a dead instance's objects movable only while a write
	// sent then still lands before the instance could take its Lease back
	// (Tracker.WriteTimeout). One value for every writer: `sharder run`
	// gives the same one to each.
	DefaultWriteTimeout = 2 * time.Second

	// uncertainAfter: an expired Lease becomes uncertain at t + 2d.
	uncertainAfter = 2
	// orphanedAfter: a dead Lease becomes orphaned at t + 10d.
	orphanedAfter = 10
	// TakeoverFactor: the sharder holds an uncertain Lease it takes for
	// TakeoverFactor × d.
	TakeoverFactor = 2
)

// MaxVirtualNodes is the largest weight a Lease may ask for with the
// sharder.dev/virtual-nodes label (the same bound as a ring's
// spec.virtualNodes). Larger values are rejected rather than capped, so that
// one Lease cannot blow up the size of a ring.
const MaxVirtualNodes = 10000

// ErrInvalidVirtualNodes is wrapped by VirtualNodesOf for a label that is not
// an integer in [1, MaxVirtualNodes].
var ErrInvalidVirtualNodes = errors.New("invalid " + v1alpha1.LabelVirtualNodes + " label")

// ErrInvalidMaxWatchLag is wrapped by MaxWatchLagOf for an annotation that is
// not a positive Go duration of at most MaxLeaseDuration.
var ErrInvalidMaxWatchLag = errors.New("invalid " + v1alpha1.AnnotationMaxWatchLag + " annotation")

// MaxWatchLagOf returns the watch lag an instance promises with its Lease's
// sharder.dev/max-watch-lag annotation: 0 and no error when it is absent (no
// promise); 0 and an error wrapping ErrInvalidMaxWatchLag when the value is
// not a positive Go duration of at most MaxLeaseDuration.
func MaxWatchLagOf(lease *coordinationv1.Lease) (time.Duration, error) {
	value, ok := lease.Annotations[v1alpha1.AnnotationMaxWatchLag]
	if !ok {
		return 0, nil
	}
	d, err := time.ParseDuration(value)
	if err != nil || d <= 0 || d > MaxLeaseDuration {
		return 0, fmt.Errorf("%w: %q is not a positive duration of at most %v", ErrInvalidMaxWatchLag, value, MaxLeaseDuration)
	}
	return d, nil
}

// ErrInvalidMaxStop is wrapped by MaxStopOf for an annotation that is not a
// positive Go duration of at most MaxLeaseDuration.
var ErrInvalidMaxStop = errors.New("invalid " + v1alpha1.AnnotationMaxStop + " annotation")

// MaxStopOf returns the bound on stopping an instance promises with its
// Lease's sharder.dev/max-stop annotation: 0 and no error when it is absent
// (no promise beyond the Lease's margin); 0 and an error wrapping
// ErrInvalidMaxStop when the value is not a positive Go duration of at most
// MaxLeaseDuration.
func MaxStopOf(lease *coordinationv1.Lease) (time.Duration, error) {
	value, ok := lease.Annotations[v1alpha1.AnnotationMaxStop]
	if !ok {
		return 0, nil
	}
	d, err := time.ParseDuration(value)
	if err != nil || d <= 0 || d > MaxLeaseDuration {
		return 0, fmt.Errorf("%w: %q is not a positive duration of at most %v", ErrInvalidMaxStop, value, MaxLeaseDuration)
	}
	return d, nil
}

// maxStop is MaxStopOf with a malformed annotation read as no promise (the
// lease controller reports it).
func maxStop(lease *coordinationv1.Lease) time.Duration {
	s, err := MaxStopOf(lease)
	if err != nil {
		return 0
	}
	return s
}

// GoneAfter is how long after the sharder observed an instance's last
// renewal the instance may still be running a reconcile, with a Lease of
// duration d and a promised bound on stopping of stop (MaxStopOf): an
// expired instance becomes uncertain (and a vanished one dead) only then.
// The instance stops admitting reconciles at its renew deadline, shorter
// than d, after the start of that renewal, and its cancelled reconciles
// return within stop; the sharder observed the renewal after it started. So
// d + stop would do: the second d of 2d, the least, is the margin for the
// rates of the clocks and the delays of the watch.
func GoneAfter(d, stop time.Duration) time.Duration {
	return max(uncertainAfter*d, d+stop)
}

// FenceWait is how long after its fence of an instance (a takeover of its
// Lease of duration d, observed landed) the sharder waits before it grants
// the instance's slots to others: the instance's last renewal began before
// the takeover, it stops admitting reconciles at its renew deadline, shorter
// than d, after that start, and its cancelled reconciles return within stop
// (MaxStopOf).
func FenceWait(d, stop time.Duration) time.Duration {
	return d + stop
}

// StateOf returns the state of an instance Lease at now and the time of its
// next transition by the passage of time alone (zero when there is none:
// uncertain and orphaned Leases change only by a write).
//
// With t the Lease's reference time and d its duration:
//
//	ready      holder = Lease name, now < t+d
//	expired    holder = Lease name, t+d <= now < t+2d
//	uncertain  holder = Lease name, now >= t+2d
//	dead       holder empty (released) or another holder (taken), now < t+10d
//	orphaned   dead, now >= t+10d
//
// Malformed Leases get a state by the same table, never an error:
//   - t is spec.renewTime; without it spec.acquireTime; without that the
//     creation time; a Lease without any of them counts as renewed at the
//     zero time (so it is uncertain, or orphaned when it has no holder).
//   - d is spec.leaseDurationSeconds; a missing or non-positive value counts
//     as DefaultLeaseDuration, a value above MaxLeaseDuration as
//     MaxLeaseDuration.
//   - a missing holderIdentity is an empty one: dead.
//
// A Lease whose name is not a valid label value is invalid: no object can
// be labelled for it, so it never receives any (see InvalidID).
//
// StateOf reads only the Lease and now, so it trusts the times written on
// the Lease. The sharder does not: it computes states with a Tracker, which
// counts a renewal from when it observed it, never from a later time the
// Lease claims.
func StateOf(lease *coordinationv1.Lease, now time.Time) (State, time.Time) {
	return stateAt(lease, ReferenceTime(lease), now)
}

// stateAt is StateOf with the reference time t given.
func stateAt(lease *coordinationv1.Lease, t, now time.Time) (State, time.Time) {
	if InvalidID(lease.Name) != nil {
		return StateInvalid, time.Time{}
	}
	return validStateAt(lease, t, now)
}

// validStateAt is stateAt for a Lease whose name is a valid instance ID.
func validStateAt(lease *coordinationv1.Lease, t, now time.Time) (State, time.Time) {
	d := DurationOf(lease)
	holder := ""
	if lease.Spec.HolderIdentity != nil {
		holder = *lease.Spec.HolderIdentity
	}

	if holder == "" || holder != lease.Name {
		orphaned := t.Add(orphanedAfter * d)
		if now.Before(orphaned) {
			return StateDead, orphaned
		}
		return StateOrphaned, time.Time{}
	}
	expired := t.Add(d)
	if now.Before(expired) {
		return StateReady, expired
	}
	uncertain := t.Add(GoneAfter(d, maxStop(lease)))
	if now.Before(uncertain) {
		return StateExpired, uncertain
	}
	return StateUncertain, time.Time{}
}

// NextTransition returns leaseTransitions after one more change of holder:
// n + 1, but never past the largest int32. An overflow would be a negative
// count, which the API server rejects, and the Lease could never be
// acquired or taken again.
func NextTransition(n int32) int32 {
	if n == math.MaxInt32 {
		return n
	}
	return n + 1
}

// VirtualNodesOf returns the weight a Lease asks for with its
// sharder.dev/virtual-nodes label: 0 and no error when the label is absent
// (the ring's default applies); 0 and an error wrapping
// ErrInvalidVirtualNodes when the value is not an integer in
// [1, MaxVirtualNodes].
func VirtualNodesOf(lease *coordinationv1.Lease) (int, error) {
	value, ok := lease.Labels[v1alpha1.LabelVirtualNodes]
	if !ok {
		return 0, nil
	}
	n, err := strconv.Atoi(value)
	if err != nil || n < 1 || n > MaxVirtualNodes {
		return 0, fmt.Errorf("%w: %q is not an integer from 1 to %d", ErrInvalidVirtualNodes, value, MaxVirtualNodes)
	}
	return n, nil
}

// MemberOf returns the Lease as a ring member at now. A malformed weight
// label gives VirtualNodes 0 (the ring's default): the instance keeps its
// place in the ring with the default weight; a malformed
// sharder.dev/max-watch-lag or sharder.dev/max-stop annotation gives
// MaxWatchLag or MaxStop 0 (no promise); the lease controller reports each
// in an event.
func MemberOf(lease *coordinationv1.Lease, now time.Time) Member {
	state, _ := StateOf(lease, now)
	weight, err := VirtualNodesOf(lease)
	if err != nil {
		weight = 0
	}
	lag, err := MaxWatchLagOf(lease)
	if err != nil {
		lag = 0
	}
	return Member{ID: lease.Name, VirtualNodes: weight, State: state, MaxWatchLag: lag, MaxStop: maxStop(lease)}
}

// ReferenceTime returns t: renewTime, else acquireTime, else creation time.
func ReferenceTime(lease *coordinationv1.Lease) time.Time {
	switch {
	case lease.Spec.RenewTime != nil:
		return lease.Spec.RenewTime.Time
	case lease.Spec.AcquireTime != nil:
		return lease.Spec.AcquireTime.Time
	default:
		return lease.CreationTimestamp.Time
	}
}

// DurationOf returns d: leaseDurationSeconds within (0, MaxLeaseDuration],
// else DefaultLeaseDuration.
func DurationOf(lease *coordinationv1.Lease) time.Duration {
	s := lease.Spec.LeaseDurationSeconds
	switch {
	case s == nil || *s <= 0:
		return DefaultLeaseDuration
	case time.Duration(*s)*time.Second > MaxLeaseDuration:
		return MaxLeaseDuration
	}
	return time.Duration(*s) * time.Second
}
