package leaseholder

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/pkg/membership"
)

// Defaults of Options.
const (
	// DefaultLeaseDuration is the Lease's duration, the one the sharder
	// assumes for instances it has not seen.
	DefaultLeaseDuration = membership.DefaultLeaseDuration
	// DefaultShutdownTimeout bounds BeforeRelease and the release together.
	DefaultShutdownTimeout = 30 * time.Second
)

// Options configures a Holder.
type Options struct {
	// Ring is the ring the instance belongs to (sharder.dev/ring). Required.
	Ring string
	// Namespace is the ring's spec.leaseNamespace. Required.
	Namespace string
	// Identity is the instance ID: the Lease's name and holderIdentity, and
	// the shard label's value on the instance's objects (ValidateIdentity).
	// It must stay the same across restarts of the instance, or a restart
	// moves its objects. Default: DefaultIdentity().
	Identity string

	// VirtualNodes is the instance's weight, written into the
	// sharder.dev/virtual-nodes label. Default: 0, no label (the ring's
	// default weight).
	VirtualNodes int

	// LeaseDuration is the Lease's leaseDurationSeconds: a whole number of
	// seconds. Default: 15s.
	LeaseDuration time.Duration
	// RenewPeriod is the time between renewals; after a failed attempt the
	// holder retries after a quarter of it. It must be shorter than
	// RenewDeadline. Default: LeaseDuration / 3 (5s).
	RenewPeriod time.Duration
	// RenewDeadline is how long after the start of its last successful
	// renewal the holder gives up: it stops renewing and calls OnLost. It
	// must be longer than RenewPeriod and shorter than LeaseDuration: the
	// difference to LeaseDuration is the margin between this holder stopping
	// and a successor with the same instance ID acquiring the Lease, which
	// covers the time OnLost takes to stop the instance and some clock
	// drift. Default: LeaseDuration * 2 / 3 (10s).
	RenewDeadline time.Duration

	// Pod, when set, becomes an ownerReference of the Lease (replacing older
	// Pod ownerReferences), so that garbage collection deletes the Lease
	// with the Pod. A release for a restart (ReleaseRestart) removes it, so
	// that the Lease outlives the pod it is created again as. Default: none.
	Pod *metav1.OwnerReference

	// OnLost is called once when the holder could not renew the Lease within
	// RenewDeadline of its last renewal, or found it taken, deleted, or
	// without its ring label (removed or changed). The instance must stop
	// reconciling at once: the sharder may move its objects. Start returns
	// an error wrapping ErrLeaseLost right after OnLost; leave the exit of
	// the process to main, as with a manager's lost leader election.
	// Default: none.
	OnLost func()

	// Release is how the Lease is handed back on a graceful stop: Restart
	// (the instance comes back with the same ID: the sharder keeps its
	// objects for the ring's restartHold) or Stop (its objects move at
	// once). Default: Stop.
	Release Release

	// BeforeRelease is called on shutdown, before the Lease is released, with
	// a context bounded by ShutdownTimeout. The holder keeps renewing while it
	// runs. Use it to wait for in-flight reconciles. When it returns an error
	// (work still in flight), the Lease is not released but left to expire:
	// the sharder then waits two lease durations before it moves the
	// instance's objects, instead of moving them at once. Default: none.
	BeforeRelease func(ctx context.Context) error

	// ShutdownTimeout bounds BeforeRelease and the release together.
	// Default: 30s.
	ShutdownTimeout time.Duration

	// Check, when set, is called before every acquisition and renewal; while
	// it returns an error the holder does not write the Lease (a failed
	// renewal). An acquisition that only Check refused is tried again after
	// 250ms (or RenewPeriod, if shorter). Default: none.
	Check func(ctx context.Context) error

	// Reader reads the Lease. Pass an uncached reader (mgr.GetAPIReader())
	// when the client reads from a cache: the holder decides on what it
	// reads. Default: the client.
	Reader client.Reader

	// MaxWatchLag, when positive and the client watches (NewHolder), is
	// written on the Lease as its sharder.dev/max-watch-lag annotation: the
	// instance's promise that it reconciles nothing while the last renewal
	// it saw come back through its watch on the Lease (WatchedAt) was
	// written longer ago than this. The sharder waits that much longer
	// before assigning an object it released from the instance by a forced
	// move. The holder only writes the promise; keeping it is the caller's
	// part (pkg/instance does, and sets a default: see
	// instance.Options.Lease). Default: 0, no promise.
	MaxWatchLag time.Duration

	// StopTimeout, when positive, is written on the Lease as its
	// sharder.dev/max-stop annotation: the instance's promise that every
	// reconcile it cancels because it may no longer act returns within this
	// much of the cancellation, or its process exits. The sharder waits that
	// much longer before another instance gets an object the instance may
	// still be working on. The holder only writes the promise; keeping it is
	// the caller's part (pkg/instance does, and sets a default: see
	// instance.Options.Lease). Default: 0, no promise.
	StopTimeout time.Duration

	// Clock tells the time and runs the timers. Default: the real clock.
	Clock clock.Clock

	// watching reports whether the holder's client can watch its Lease.
	watching bool
}

// Default fills in the defaults of unset fields that need no client, as
// each field's comment states: the identity, the Lease's timings, the
// shutdown timeout, the release and the clock. NewHolder calls it; callers
// that derive settings of their own from the defaulted timings (as
// pkg/instance does) call it first. An identity it cannot default is left
// empty, for validation to report.
func (o *Options) Default() {
	if o.Identity == "" {
		o.Identity, _ = membership.DefaultIdentity()
	}
	if o.LeaseDuration == 0 {
		o.LeaseDuration = DefaultLeaseDuration
	}
	if o.RenewPeriod == 0 {
		o.RenewPeriod = o.LeaseDuration / 3
	}
	if o.RenewDeadline == 0 {
		o.RenewDeadline = o.LeaseDuration * 2 / 3
	}
	if o.ShutdownTimeout == 0 {
		o.ShutdownTimeout = DefaultShutdownTimeout
	}
	if o.Release == "" {
		o.Release = ReleaseStop
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
}

// setDefaults fills in the defaults of unset fields, as each field's comment
// states; c is the default Reader. It fails only when Identity is unset and
// this process has no default instance ID.
func (o *Options) setDefaults(c client.Client) error {
	if o.Identity == "" {
		if _, err := membership.DefaultIdentity(); err != nil {
			return fmt.Errorf("instance ID: %w", err)
		}
	}
	o.Default()
	if o.Reader == nil {
		o.Reader = c
	}
	_, o.watching = c.(client.WithWatch)
	return nil
}

// Validate checks the options once their defaults are filled in (Default),
// and returns every violation at once; each error names its option. The timing
// rules are the ones Options states: whole seconds for the lease
// duration, and renew period < renew deadline < lease duration.
func (o *Options) Validate() error {
	var errs []error
	if o.Ring == "" || len(validation.IsDNS1123Label(o.Ring)) > 0 {
		errs = append(errs, fmt.Errorf("ring %q: must be a DNS label", o.Ring))
	}
	if o.Namespace == "" {
		errs = append(errs, errors.New("lease namespace: required"))
	} else if msgs := validation.IsDNS1123Label(o.Namespace); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("lease namespace %q: must be a namespace name: %s", o.Namespace, strings.Join(msgs, "; ")))
	}
	if err := ValidateIdentity(o.Identity); err != nil {
		errs = append(errs, err)
	}
	if o.VirtualNodes < 0 || o.VirtualNodes > membership.MaxVirtualNodes {
		errs = append(errs, fmt.Errorf("virtual nodes %d: must be from 1 to %d, or 0 for the ring's default", o.VirtualNodes, membership.MaxVirtualNodes))
	}
	if o.LeaseDuration < time.Second || o.LeaseDuration%time.Second != 0 || o.LeaseDuration > membership.MaxLeaseDuration {
		errs = append(errs, fmt.Errorf("lease duration %v: must be a whole number of seconds from 1s to %v", o.LeaseDuration, membership.MaxLeaseDuration))
	}
	if o.RenewDeadline <= 0 || o.RenewDeadline >= o.LeaseDuration {
		errs = append(errs, fmt.Errorf("renew deadline %v: must be positive and shorter than the lease duration %v", o.RenewDeadline, o.LeaseDuration))
	}
	if o.RenewPeriod <= 0 || o.RenewPeriod >= o.RenewDeadline {
		errs = append(errs, fmt.Errorf("renew period %v: must be positive and shorter than the renew deadline %v (lease duration %v)", o.RenewPeriod, o.RenewDeadline, o.LeaseDuration))
	}
	if o.MaxWatchLag != 0 && (o.MaxWatchLag <= o.RenewPeriod || o.MaxWatchLag > membership.MaxLeaseDuration) {
		errs = append(errs, fmt.Errorf("max watch lag %v: must be longer than the renew period %v (the renewals are what the watch proves itself with) and at most %v, or 0 for no promise",
			o.MaxWatchLag, o.RenewPeriod, membership.MaxLeaseDuration))
	}
	if o.StopTimeout < 0 || o.StopTimeout > membership.MaxLeaseDuration {
		errs = append(errs, fmt.Errorf("stop timeout %v: must be at most %v, or 0 for no promise", o.StopTimeout, membership.MaxLeaseDuration))
	}
	if o.ShutdownTimeout < 0 {
		errs = append(errs, fmt.Errorf("shutdown timeout %v: must not be negative", o.ShutdownTimeout))
	}
	if o.Release != ReleaseStop && o.Release != ReleaseRestart {
		errs = append(errs, fmt.Errorf("release %q: must be %s or %s", o.Release, ReleaseStop, ReleaseRestart))
	}
	return errors.Join(errs...)
}
