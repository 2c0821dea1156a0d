package instance

import (
	"errors"
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/clock"

	"github.com/sharder-dev/sharder/pkg/instance/leaseholder"
	"github.com/sharder-dev/sharder/pkg/membership"
)

// Options configures an instance. Ring and LeaseNamespace are required.
type Options struct {
	// Ring is the name of the ControllerRing whose objects this instance
	// reconciles. Required.
	Ring string

	// LeaseNamespace is the ring's spec.leaseNamespace: the instance's Lease
	// is created there. Required.
	LeaseNamespace string

	// Identity is the instance ID: the name of its Lease and the value of the
	// shard label on its objects. It must be the identity given to
	// NewCache, and stable across restarts of the same instance (a new
	// identity moves every object).
	// Default: DefaultIdentity() (the POD_NAME variable, else the hostname).
	Identity string

	// VirtualNodes is the instance's weight in the ring, written to its
	// Lease's sharder.dev/virtual-nodes label.
	// Default: 0, no label: the ring's spec.virtualNodes.
	VirtualNodes int

	// LeaseDuration is the Lease's duration, a whole number of seconds: the
	// sharder moves this instance's objects away when it has not renewed the
	// Lease for about twice as long.
	// Default: leaseholder.DefaultLeaseDuration (15s).
	LeaseDuration time.Duration

	// RenewPeriod is how often the Lease is renewed; it must be shorter than
	// RenewDeadline.
	// Default: LeaseDuration/3 (5s for the default duration).
	RenewPeriod time.Duration

	// RenewDeadline is how long after its last successful renewal the
	// instance gives up the Lease (stops reconciling, OnLost); it must be
	// shorter than LeaseDuration, so that the instance has stopped before a
	// successor with the same identity could acquire the Lease.
	// Default: LeaseDuration*2/3 (10s for the default duration).
	RenewDeadline time.Duration

	// Pod, when set, becomes the Lease's owner, so that garbage collection
	// removes the Lease with the instance's Pod.
	// Default: none.
	Pod *metav1.OwnerReference

	// OnLost is called once the instance has lost its Lease (it could not
	// renew it within RenewDeadline, another party took it, or it was
	// deleted or left the ring). By then the instance has stopped admitting
	// reconciles for good and cancelled those in flight (cause ErrLeaseLost);
	// the Lease holder then stops, and with it the manager: mgr.Start returns
	// an error wrapping ErrLeaseLost, and the usual answer is to exit
	// non-zero and let the process restart, as after lost leader election.
	// OnLost is for callers who want to react before that (a metric, an
	// alert).
	// Default: none.
	OnLost func()

	// Release is how the instance hands its Lease back on a graceful stop,
	// once its reconciles in flight have finished: leaseholder.ReleaseRestart when
	// the instance comes back with the same ID (a StatefulSet's pod), so
	// that the sharder keeps its objects for the ring's restartHold and a
	// rolling update moves no object; leaseholder.ReleaseStop when it does not (a
	// Deployment's pod), so that its objects move at once.
	// Default: leaseholder.ReleaseStop.
	Release leaseholder.Release

	// ShutdownTimeout bounds how long shutdown waits for reconciles in flight
	// and releases the Lease. When reconciles are still in flight at its end,
	// the Lease is not released but left to expire.
	// Default: leaseholder.DefaultShutdownTimeout (30s).
	ShutdownTimeout time.Duration

	// StopTimeout is the instance's bound on stopping: a reconcile it
	// cancels because it may no longer act (ErrLeaseLost: its Lease lost or
	// its renew deadline passed; ErrMoved: its object assigned elsewhere
	// without its acknowledgement; ErrStaleWatch: its watch behind; a
	// shutdown whose ShutdownTimeout ended with reconciles in flight) must
	// return within StopTimeout of the cancellation. When one has not, the
	// instance calls OnStopOverdue, whose default ends the process. The
	// instance promises it on its Lease (sharder.dev/max-stop), and the
	// sharder counts it in every wait that ends with another instance on
	// the instance's objects (docs/design.md §3, §5, §11), so that a
	// reconcile that ignores its context cannot run beside the next
	// instance's: a longer bound makes fail-overs and forced moves slower,
	// once it exceeds the defaults' margins. It must be positive and at most
	// membership.MaxLeaseDuration.
	// Default: LeaseDuration − RenewDeadline (5s for the default Lease),
	// the margin the Lease already leaves, so that the default costs no
	// fail-over any time.
	StopTimeout time.Duration

	// OnStopOverdue is called, with the number still running, when
	// reconciles cancelled because the instance may no longer act have not
	// returned within StopTimeout. The instance's promise on its Lease holds
	// only if it ends the process (or those reconciles) at once: its
	// default logs the reconciles and exits the process with status 1, as
	// most programs do on lost leader election. Set it to flush what the
	// process must before it exits; tests set it to observe the overdue
	// stop.
	// Default: exit the process.
	OnStopOverdue func(running int)

	// RetryPeriod is how soon a request that arrives before the instance holds
	// its Lease, or while its watch is behind (MaxWatchLag), is tried again.
	// Default: 1s.
	RetryPeriod time.Duration

	// MaxWatchLag is how far behind the API server the instance lets its
	// watches fall before it stops reconciling. The instance proves its
	// watch current with its own Lease renewals: while the newest renewal
	// that came back through its watch on the Lease was sent longer ago
	// than MaxWatchLag, it admits no reconcile (requests are retried after
	// RetryPeriod) and cancels those in flight (cause ErrStaleWatch); it
	// resumes when the watch catches up. It promises this on its Lease
	// (sharder.dev/max-watch-lag), and the sharder waits that much longer
	// after a forced move before another instance gets the object, so that
	// an instance whose watch stalled while its writes still pass cannot
	// work on an object alongside its next instance. It must be longer than
	// RenewPeriod. The proof covers the instance's connection to the API
	// server, which the Lease watch shares with the cache's watches (one
	// HTTP client), not a delay of one resource's watch inside the API
	// server.
	// Default: RenewDeadline (10s for the default Lease duration); negative:
	// no check and no promise.
	MaxWatchLag time.Duration

	// SlotCacheLinger is, in slot mode, how long at most the cache keeps
	// watching a released slot whose watch group still holds other slots
	// of the instance, before it lists that group again without it (the
	// slots released meanwhile go with the first). Each such list
	// costs the API server a pass over every object of the resource,
	// whatever the selector; deferring it keeps those lists out of the
	// hand-over, when the slots' new holders list them. The record, not the
	// cache, admits reconciles: a lingering slot's objects stay readable from
	// the cache meanwhile, but are never reconciled. A group left without
	// any slot is dropped at once, which costs no list.
	// Default: DefaultSlotCacheLinger (30s); negative: at once.
	SlotCacheLinger time.Duration

	// ShardedListAndWatch makes an instance of a ring of unit Slots watch
	// its slots with the API server's shard selector on the namespace
	// instead of the slot label (docs/design.md §11, "Sharded list and
	// watch"): each watch group's watch of a resource carries shardSelector
	// = shardRange(object.metadata.namespace, start, end) || ..., one range
	// per run of consecutive slots. The instance then receives, and
	// reconciles, an object of its slots as soon as it is created, before
	// the sharder wrote its slot label (a main object of a ring of key
	// Namespace has the slot of its namespace, whether labelled yet or not).
	// NewCache reads it; pass the same Options to NewCache and Setup.
	//
	// It needs a ring of unit Slots whose slots are keyed by namespace
	// (spec.assignment.slots.key: Namespace): creating the manager fails
	// otherwise (ErrShardedListAndWatch). It applies to the ring's main
	// resources among NewCache's objects, and to its controlled resources
	// when every main resource is namespaced (the children of a namespaced
	// object are in its namespace); the controlled resources of a ring with
	// a cluster-scoped main resource, and objects of resources that are not
	// the ring's, keep the slot label selector. Note that a controlled
	// resource selected by shard brings every object of that resource in
	// the instance's namespaces into its cache, those that no object of the
	// ring controls too (they cause no reconcile).
	//
	// The shard selector is filtered by Kubernetes 1.36 and later with the
	// ShardedListAndWatch feature gate (kube-apiserver
	// --feature-gates=ShardedListAndWatch=true). A server without the gate
	// ignores it silently and returns every object: the instance still
	// holds and reconciles only its slots' objects, since it checks every
	// object's slot itself (its slot label, else its namespace's), but each
	// of its watch groups (up to 64 per resource) receives all objects of
	// the resources, far more than with the label selector; it logs that
	// once. Turn it on only where the API server has the gate. The same
	// holds for a 1.36 server's watches served without its watch cache
	// (--watch-cache=false), which it does not filter.
	//
	// An object whose slot label contradicts its namespace (set wrongly at
	// creation: the ring's policy cannot compute the hash) has the slot its
	// label names, as for an instance without this option, so that
	// instances with and without it never disagree on an object's slot;
	// but a watch by shard receives it by its namespace's slot and keeps it
	// only if its label's slot is among the watch's, so an instance
	// selecting by shard may never see it. The sharder reports such
	// objects.
	//
	// Default: false, the slot label selects every resource.
	ShardedListAndWatch bool

	// Clock tells the time: the Lease holder's renewals and deadlines, and
	// how long the instance remembers the objects it handed over. Tests pass
	// a fake clock.
	// Default: the real clock.
	Clock clock.Clock
}

// Defaults of Options. The Lease's timings and the shutdown timeout are the
// lease holder's: leaseholder.DefaultLeaseDuration and
// leaseholder.DefaultShutdownTimeout.
const (
	DefaultRetryPeriod     = time.Second
	DefaultSlotCacheLinger = 30 * time.Second
)

// DefaultIdentity returns the default instance ID: the POD_NAME environment
// variable, else the hostname. It is membership.DefaultIdentity, the one
// `sharder agent` and the Lease holder use too.
func DefaultIdentity() (string, error) {
	return membership.DefaultIdentity()
}

// setDefaults fills in the defaults of unset fields, as each field's comment
// states. It fails only when Identity is unset and this process has no
// default instance ID. The Lease's timings, ShutdownTimeout and Release are
// left to the Lease holder, which fills in and checks the same defaults.
func (o *Options) setDefaults() error {
	if o.Identity == "" {
		id, err := DefaultIdentity()
		if err != nil {
			return fmt.Errorf("instance ID: %w", err)
		}
		o.Identity = id
	}
	if o.RetryPeriod == 0 {
		o.RetryPeriod = DefaultRetryPeriod
	}
	if o.MaxWatchLag == 0 {
		// The Lease holder's default renew deadline, unless one is set.
		o.MaxWatchLag = o.RenewDeadline
		if o.MaxWatchLag == 0 {
			d := o.LeaseDuration
			if d == 0 {
				d = leaseholder.DefaultLeaseDuration
			}
			o.MaxWatchLag = d * 2 / 3
		}
	}
	if o.StopTimeout == 0 {
		d := o.LeaseDuration
		if d == 0 {
			d = leaseholder.DefaultLeaseDuration
		}
		deadline := o.RenewDeadline
		if deadline == 0 {
			deadline = d * 2 / 3
		}
		o.StopTimeout = d - deadline
	}
	if o.SlotCacheLinger == 0 {
		o.SlotCacheLinger = DefaultSlotCacheLinger
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	return nil
}

// validate checks the options the instance itself uses once their defaults
// are filled in, and returns every violation at once; each error names its
// option. The Lease holder checks the rest (NewHolder).
func (o *Options) validate() error {
	var errs []error
	if msgs := validation.IsDNS1123Label(o.Ring); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("ring %q: must be a DNS label: %s", o.Ring, strings.Join(msgs, "; ")))
	}
	if msgs := validation.IsDNS1123Label(o.LeaseNamespace); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("lease namespace %q: must be a namespace name: %s", o.LeaseNamespace, strings.Join(msgs, "; ")))
	}
	if err := leaseholder.ValidateIdentity(o.Identity); err != nil {
		errs = append(errs, err)
	}
	if o.VirtualNodes < 0 {
		errs = append(errs, fmt.Errorf("virtual nodes %d: must not be negative", o.VirtualNodes))
	}
	if o.StopTimeout <= 0 || o.StopTimeout > membership.MaxLeaseDuration {
		errs = append(errs, fmt.Errorf("stop timeout %s: must be positive and at most %s", o.StopTimeout, membership.MaxLeaseDuration))
	}
	if o.RetryPeriod < 0 {
		errs = append(errs, fmt.Errorf("retry period %s: must not be negative", o.RetryPeriod))
	}
	return errors.Join(errs...)
}
