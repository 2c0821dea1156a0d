package instance

import (
	"errors"
	"fmt"
	"time"

	"github.com/sharder-dev/sharder/pkg/instance/leaseholder"
	"github.com/sharder-dev/sharder/pkg/membership"
)

// Options configures an instance. Ring and Lease.Namespace are required.
// Pass the same Options to NewCache and Setup.
type Options struct {
	// Ring is the name of the ControllerRing whose objects this instance
	// reconciles. Required.
	Ring string

	// Identity is the instance ID: the name of its Lease and the value of the
	// shard label on its objects. It must be stable across restarts of the
	// same instance (a new identity moves every object).
	// Default: DefaultIdentity() (the POD_NAME variable, else the hostname).
	Identity string

	// Lease configures the instance's Lease and its holder: its Namespace
	// (the ring's spec.leaseNamespace, required), duration, renewals,
	// weight, owner Pod, how it is released, the shutdown timeout and the
	// clock (leaseholder.Options states each). Its Ring and Identity are
	// the instance's: leave them empty (Setup refuses others). Setup
	// calls the instance's own handlers before Lease.OnLost and
	// Lease.BeforeRelease, and fills in what the instance promises on its
	// Lease, with these defaults:
	//
	//   - Lease.StopTimeout, the instance's bound on stopping: a reconcile
	//     it cancels because it may no longer act (ErrLeaseLost, ErrMoved,
	//     ErrStaleWatch, ErrShutdownOverdue) must return within it, or the
	//     instance calls OnStopOverdue. Default: Lease.LeaseDuration −
	//     Lease.RenewDeadline (5s for the default Lease), the margin the
	//     Lease already leaves, so that the default costs no fail-over any
	//     time; it must be positive.
	//   - Lease.MaxWatchLag, how far behind the API server the instance lets
	//     its watches fall before it stops reconciling: while the newest
	//     renewal that came back through its watch on the Lease was sent
	//     longer ago, it admits no reconcile (requests are retried after
	//     RetryPeriod) and cancels those in flight (cause ErrStaleWatch).
	//     Default: Lease.RenewDeadline (10s for the default Lease);
	//     negative: no check and no promise.
	Lease leaseholder.Options

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
	if o.Lease.Ring == "" {
		o.Lease.Ring = o.Ring
	}
	if o.Lease.Identity == "" {
		o.Lease.Identity = o.Identity
	}
	o.Lease.Default()
	if o.Lease.MaxWatchLag == 0 {
		o.Lease.MaxWatchLag = o.Lease.RenewDeadline
	}
	if o.Lease.StopTimeout == 0 {
		o.Lease.StopTimeout = o.Lease.LeaseDuration - o.Lease.RenewDeadline
	}
	if o.RetryPeriod == 0 {
		o.RetryPeriod = DefaultRetryPeriod
	}
	if o.SlotCacheLinger == 0 {
		o.SlotCacheLinger = DefaultSlotCacheLinger
	}
	return nil
}

// validate checks the options once their defaults are filled in and returns
// every violation at once, each naming its option; the Lease's own rules
// are the holder's (NewHolder checks them).
func (o *Options) validate() error {
	var errs []error
	if o.Lease.Ring != o.Ring {
		errs = append(errs, fmt.Errorf("lease ring %q: must be empty or the instance's ring %q", o.Lease.Ring, o.Ring))
	}
	if o.Lease.Identity != o.Identity {
		errs = append(errs, fmt.Errorf("lease identity %q: must be empty or the instance's identity %q", o.Lease.Identity, o.Identity))
	}
	if o.Lease.StopTimeout <= 0 || o.Lease.StopTimeout > membership.MaxLeaseDuration {
		errs = append(errs, fmt.Errorf("stop timeout %s: must be positive and at most %s", o.Lease.StopTimeout, membership.MaxLeaseDuration))
	}
	if o.RetryPeriod < 0 {
		errs = append(errs, fmt.Errorf("retry period %s: must not be negative", o.RetryPeriod))
	}
	holder := o.Lease
	holder.MaxWatchLag = max(holder.MaxWatchLag, 0) // negative: no check, no promise
	return errors.Join(append(errs, holder.Validate())...)
}
