package leaseholder

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
)

// ErrLeaseLost is returned by Holder.Start when the holder could not renew
// its Lease within the lease duration, or found it held by someone else.
var ErrLeaseLost = errors.New("instance Lease lost")

// Defaults of HolderOptions.
const (
	// DefaultLeaseDuration is the Lease's duration, the one the sharder
	// assumes for instances it has not seen.
	DefaultLeaseDuration = membership.DefaultLeaseDuration
	// DefaultShutdownTimeout bounds BeforeRelease and the release together.
	DefaultShutdownTimeout = 30 * time.Second
)

// DefaultIdentity returns the instance ID of this process: the POD_NAME
// environment variable (set it from the downward API), else the hostname.
// Both are stable across restarts of a StatefulSet's pod.
func DefaultIdentity() (string, error) {
	if name := os.Getenv("POD_NAME"); name != "" {
		return name, nil
	}
	name, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("finding the instance ID: POD_NAME is not set and the hostname is unknown: %w", err)
	}
	return name, nil
}

// ValidateIdentity checks that id can be an instance ID: the name of a Lease
// (a DNS subdomain) and the value of the shard label on the instance's
// objects (at most 63 characters). An ID that is only a valid Lease name
// would let the instance join the ring while every label write naming it
// fails, leaving its objects unassigned.
func ValidateIdentity(id string) error {
	if err := membership.InvalidID(id); err != nil {
		return fmt.Errorf("%w; choose an ID of at most 63 lowercase letters, digits, '-' and '.', starting and ending with a letter or digit "+
			"(set it explicitly, or set POD_NAME from the downward API, rather than rely on the hostname)", err)
	}
	return nil
}

// Release says how a holder hands its Lease back on a graceful stop.
type Release string

const (
	// ReleaseStop hands the Lease back for good: the sharder moves the
	// instance's objects at once. For instances whose ID changes with every
	// start (a Deployment's pods).
	ReleaseStop Release = "Stop"
	// ReleaseRestart hands the Lease back marked as restarting (annotation
	// sharder.dev/restarting): the sharder keeps the instance's objects
	// where they are, and gives it no new ones, for the ring's
	// restartHold, and the next process with the same ID acquires the
	// Lease at once and resumes. For instances that come back with the
	// same ID (a StatefulSet's pods): a rolling update moves no object.
	ReleaseRestart Release = "Restart"
)

// HolderOptions configures a Holder.
type HolderOptions struct {
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

	// Clock tells the time and runs the timers. Default: the real clock.
	Clock clock.Clock
}

// setDefaults fills in defaults and checks the options.
func (o *HolderOptions) setDefaults(c client.Client) error {
	if o.Ring == "" || len(validation.IsDNS1123Label(o.Ring)) > 0 {
		return fmt.Errorf("ring %q: must be a DNS label", o.Ring)
	}
	if o.Namespace == "" {
		return errors.New("the lease namespace is required")
	}
	if o.Identity == "" {
		id, err := DefaultIdentity()
		if err != nil {
			return err
		}
		o.Identity = id
	}
	if err := ValidateIdentity(o.Identity); err != nil {
		return err
	}
	if o.VirtualNodes < 0 || o.VirtualNodes > membership.MaxVirtualNodes {
		return fmt.Errorf("virtual nodes %d: must be from 1 to %d, or 0 for the ring's default", o.VirtualNodes, membership.MaxVirtualNodes)
	}
	if o.LeaseDuration == 0 {
		o.LeaseDuration = DefaultLeaseDuration
	}
	if o.LeaseDuration < time.Second || o.LeaseDuration%time.Second != 0 || o.LeaseDuration > membership.MaxLeaseDuration {
		return fmt.Errorf("lease duration %v: must be a whole number of seconds from 1s to %v", o.LeaseDuration, membership.MaxLeaseDuration)
	}
	if o.RenewPeriod == 0 {
		o.RenewPeriod = o.LeaseDuration / 3
	}
	if o.RenewDeadline == 0 {
		o.RenewDeadline = o.LeaseDuration * 2 / 3
	}
	if o.RenewDeadline <= 0 || o.RenewDeadline >= o.LeaseDuration {
		return fmt.Errorf("renew deadline %v: must be positive and shorter than the lease duration %v", o.RenewDeadline, o.LeaseDuration)
	}
	if o.RenewPeriod <= 0 || o.RenewPeriod >= o.RenewDeadline {
		return fmt.Errorf("renew period %v: must be positive and shorter than the renew deadline %v (lease duration %v)", o.RenewPeriod, o.RenewDeadline, o.LeaseDuration)
	}
	if o.ShutdownTimeout == 0 {
		o.ShutdownTimeout = DefaultShutdownTimeout
	}
	if o.ShutdownTimeout < 0 {
		return fmt.Errorf("shutdown timeout %v: must not be negative", o.ShutdownTimeout)
	}
	switch o.Release {
	case "":
		o.Release = ReleaseStop
	case ReleaseStop, ReleaseRestart:
	default:
		return fmt.Errorf("release %q: must be %s or %s", o.Release, ReleaseStop, ReleaseRestart)
	}
	if o.Reader == nil {
		o.Reader = c
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	return nil
}

// Holder holds an instance's Lease: it creates or acquires it, renews it,
// and releases it on shutdown. It is a manager.Runnable that runs on every
// replica (it does not need leader election).
//
// Guarantees:
//   - It never takes a Lease another process holds: a Lease held by another
//     identity, or by the same identity but written by another process (two
//     processes claiming one instance ID), is acquired only once this holder
//     has watched it stay unrenewed for its leaseDurationSeconds, timed on
//     its own clock from when it first read that version, as client-go's
//     leader election does: no clock of another node decides, and a clock
//     here that lags, runs ahead or steps cannot cut a hold short. This
//     includes the sharder's hold of a dead instance's Lease while its
//     objects move. A released Lease (no holder) is acquired at once: the
//     sharder moves objects only while it holds the Lease, and its hold is
//     a write locked on the version this holder would replace.
//   - Every write carries the resourceVersion it was computed from.
//   - A write whose reply was lost (a timeout after the request reached the
//     API server) is not taken for someone else's: the holder remembers the
//     specs it sent since its last confirmed write and recognises them.
//   - OnLost is called no later than RenewDeadline after the start of the
//     last successful renewal, measured with Clock, even when API requests
//     hang: LeaseDuration - RenewDeadline before a successor with the same
//     instance ID could acquire the Lease (renewTime + LeaseDuration), and
//     well before the sharder moves objects (twice LeaseDuration).
//   - A Lease deleted, taken, or moved out of the ring while held is lost
//     as soon as the watch on it (when the client is a client.WithWatch)
//     delivers the change and a direct read confirms it, at the latest at
//     the next renewal; the holder never writes such a Lease back.
//   - A missing Lease is created only LeaseDuration after the holder first
//     found it missing: any previous holder of the same instance ID whose
//     Lease vanished has given up by then (RenewDeadline < LeaseDuration),
//     provided it used the same lease duration.
//   - It renews nothing while Check fails.
type Holder struct {
	client client.Client
	opts   HolderOptions
	log    logr.Logger

	started atomic.Bool
	held    atomic.Bool

	// lease is the version last written by this holder, nil while not held.
	// Only the goroutine running the renewals touches it (as every field
	// below).
	lease *coordinationv1.Lease
	// renewedAt is when the last successful write started (Clock).
	renewedAt time.Time
	// unconfirmed holds the specs of the writes sent since the last confirmed
	// one, oldest first: a write whose reply was lost (a timeout) may still
	// have landed, and the Lease then carries a spec only this holder could
	// have written.
	unconfirmed []coordinationv1.LeaseSpec
	// missingSince is when the holder, not holding the Lease, first found
	// it missing; zero once it has seen it.
	missingSince time.Time
	// observed is the version of somebody else's Lease this holder read
	// last, and observedAt when it first read it (Clock): the Lease may be
	// acquired once it stayed unrenewed for its duration since then.
	observed   coordinationv1.LeaseSpec
	observedAt time.Time

	// woken carries the watch's requests to check the Lease.
	woken chan struct{}
}

// maxUnconfirmed bounds Holder.unconfirmed: attempts between two confirmed
// writes are spaced by a quarter of the renew period and end at the lease
// duration, so a dozen covers them; older ones are forgotten first.
const maxUnconfirmed = 16

var _ manager.LeaderElectionRunnable = &Holder{}

// NewHolder checks the options, fills in their defaults and returns a holder
// writing with c. When c is also a client.WithWatch (client.NewWithWatch),
// the holder watches its own Lease by name, which needs list and watch on
// Leases in the namespace besides get, create and update; otherwise it finds
// a vanished Lease at its next renewal.
func NewHolder(c client.Client, opts HolderOptions) (*Holder, error) {
	if c == nil {
		return nil, errors.New("lease holder: a client is required")
	}
	if err := opts.setDefaults(c); err != nil {
		return nil, fmt.Errorf("lease holder: %w", err)
	}
	return &Holder{client: c, opts: opts, log: logr.Discard(), woken: make(chan struct{}, 1)}, nil
}

// NeedLeaderElection returns false: every instance holds its own Lease.
func (h *Holder) NeedLeaderElection() bool { return false }

// Identity returns the instance ID.
func (h *Holder) Identity() string { return h.opts.Identity }

// Held reports whether the holder currently holds its Lease. It is false
// before the acquisition, after a loss and after the release.
func (h *Holder) Held() bool { return h.held.Load() }

// Start acquires the Lease, blocking until it is held or ctx is done, then
// renews it until ctx is done. On ctx's end it calls BeforeRelease (renewing
// meanwhile) and releases the Lease: holderIdentity empty, renewTime now,
// so that the sharder moves the instance's objects at once. It returns nil
// after a release, and an error wrapping ErrLeaseLost after calling OnLost.
// A Holder can be started once.
func (h *Holder) Start(ctx context.Context) error {
	if !h.started.CompareAndSwap(false, true) {
		return errors.New("lease holder: already started")
	}
	h.log = ctrl.LoggerFrom(ctx).WithValues("lease", klog.KRef(h.opts.Namespace, h.opts.Identity), "ring", h.opts.Ring)

	if !h.acquire(ctx) {
		return nil
	}
	h.log.Info("Acquired the instance Lease")
	// The watch runs until Start returns, through the shutdown's renewals.
	watchCtx, stopWatching := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWatching()
	h.watch(watchCtx)
	if err := h.renew(ctx); err != nil {
		return h.lost(err)
	}
	return h.shutdown(ctx)
}

// watch starts watching the Lease by name, when the client can watch, so
// that a Lease deleted, taken, or moved out of the ring is noticed without
// waiting for the next renewal. The watch only wakes the renewal loop, which
// checks with the Reader: a watch may deliver a version older than the one
// this holder wrote.
func (h *Holder) watch(ctx context.Context) {
	w, ok := h.client.(client.WithWatch)
	if !ok {
		return
	}
	byName := fields.OneTermEqualSelector("metadata.name", h.opts.Identity)
	listOptions := func(raw metav1.ListOptions) *client.ListOptions {
		return &client.ListOptions{Namespace: h.opts.Namespace, FieldSelector: byName, Raw: &raw}
	}
	suspicious := func(obj any) {
		l, ok := obj.(*coordinationv1.Lease)
		if !ok || l.Labels[v1alpha1.LabelRing] != h.opts.Ring || ptr.Deref(l.Spec.HolderIdentity, "") != h.opts.Identity {
			h.wake()
		}
	}
	_, informer := toolscache.NewInformerWithOptions(toolscache.InformerOptions{
		ListerWatcher: &toolscache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, raw metav1.ListOptions) (runtime.Object, error) {
				list := &coordinationv1.LeaseList{}
				return list, w.List(ctx, list, listOptions(raw))
			},
			WatchFuncWithContext: func(ctx context.Context, raw metav1.ListOptions) (watch.Interface, error) {
				return w.Watch(ctx, &coordinationv1.LeaseList{}, listOptions(raw))
			},
		},
		ObjectType: &coordinationv1.Lease{},
		Handler: toolscache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { suspicious(obj) },
			UpdateFunc: func(_, obj any) { suspicious(obj) },
			DeleteFunc: func(any) { h.wake() },
		},
	})
	go informer.RunWithContext(ctx)
}

// wake asks the renewal loop to check the Lease now.
func (h *Holder) wake() {
	select {
	case h.woken <- struct{}{}:
	default: // a check is pending already
	}
}

// acquire tries every RenewPeriod until the Lease is held (true) or ctx is
// done (false).
func (h *Holder) acquire(ctx context.Context) bool {
	for {
		attemptCtx, cancel := context.WithTimeout(ctx, h.opts.RenewPeriod)
		ok, err := h.tryAcquireOrRenew(attemptCtx)
		cancel()
		switch {
		case ok:
			return true
		case ctx.Err() != nil:
			return false
		case err != nil:
			h.log.Info("Could not acquire the instance Lease; retrying", "error", err.Error())
		}
		retry := h.opts.RenewPeriod
		if errors.Is(err, errCheckFailed) {
			// Only Check stands in the way (a controller that is still
			// starting beside sharder agent): ask again soon, at no cost to
			// the API server, so that a restarted instance is back as soon
			// as it can work.
			retry = min(retry, checkRetryPeriod)
		}
		if !h.wait(ctx, retry) {
			return false
		}
	}
}

// checkRetryPeriod is how soon an acquisition that only Check refused is
// tried again.
const checkRetryPeriod = 250 * time.Millisecond

// errCheckFailed is wrapped by an attempt that Check refused.
var errCheckFailed = errors.New("check failed")

// renew renews the Lease until ctx is done (nil) or the Lease is lost.
func (h *Holder) renew(ctx context.Context) error {
	period := h.opts.RenewPeriod
	for {
		if due, err := h.waitWatching(ctx, period); !due {
			return err
		}
		deadline := h.renewedAt.Add(h.opts.RenewDeadline)
		remaining := deadline.Sub(h.opts.Clock.Now())
		if remaining <= 0 {
			return fmt.Errorf("%w %v", errRenewDeadline, h.opts.RenewDeadline)
		}
		// An attempt may take the time left until the deadline: on a loaded
		// API server a renewal that answers late still keeps the Lease,
		// where cutting it at the renew period would throw it away and
		// start another just as slow.
		attemptCtx, cancel := context.WithTimeout(ctx, remaining)
		ok, err := h.tryAcquireOrRenew(attemptCtx)
		cancel()
		switch {
		case ok:
			period = h.opts.RenewPeriod
			continue
		case ctx.Err() != nil:
			// Shutdown, not a failure: the attempt was cut short by it.
			return nil //nolint:nilerr // the caller releases the Lease next
		case errors.Is(err, ErrLeaseLost):
			return err
		}
		h.log.Info("Could not renew the instance Lease; retrying", "error", fmt.Sprint(err), "deadline", deadline)
		period = max(h.opts.RenewPeriod/4, time.Millisecond)
		if rest := deadline.Sub(h.opts.Clock.Now()); rest < period {
			period = max(rest, 0)
		}
	}
}

// waitWatching waits for d, checking the Lease whenever the watch wakes
// it. It returns true once d has passed, false when ctx ended first (nil) or
// the check found the Lease lost (an error wrapping ErrLeaseLost).
func (h *Holder) waitWatching(ctx context.Context, d time.Duration) (bool, error) {
	t := h.opts.Clock.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false, nil
		case <-t.C():
			return true, nil
		case <-h.woken:
			if err := h.check(ctx); errors.Is(err, ErrLeaseLost) {
				return false, err
			}
		}
	}
}

// check reads the Lease and reports it lost when it is gone, taken, or no
// longer in the ring. Other errors are left to the next renewal.
func (h *Holder) check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, h.opts.RenewPeriod)
	defer cancel()
	current := &coordinationv1.Lease{}
	if err := h.opts.Reader.Get(ctx, h.key(), current); err != nil {
		if apierrors.IsNotFound(err) {
			return errDeleted
		}
		h.log.V(1).Info("Could not check the instance Lease", "error", err.Error())
		return err
	}
	if err := h.leftRing(current); err != nil {
		return err
	}
	if !h.ours(current) {
		return fmt.Errorf("%w: now held by %q", ErrLeaseLost, ptr.Deref(current.Spec.HolderIdentity, ""))
	}
	return nil
}

// errRenewDeadline reports renewals that failed for the renew deadline.
var errRenewDeadline = fmt.Errorf("%w: not renewed within the renew deadline", ErrLeaseLost)

// errDeleted reports a Lease deleted while held: the sharder no longer sees
// the instance as a member and may move its objects once its hold ends, so
// the instance must stop as on any other loss.
var errDeleted = fmt.Errorf("%w: the Lease was deleted", ErrLeaseLost)

// leftRing returns an error wrapping ErrLeaseLost when current no longer
// carries this holder's ring label: removed or changed, the Lease is no
// longer a member of the ring, as if it were deleted.
func (h *Holder) leftRing(current *coordinationv1.Lease) error {
	if ring, ok := current.Labels[v1alpha1.LabelRing]; !ok || ring != h.opts.Ring {
		return fmt.Errorf("%w: the Lease left ring %q (label %s=%q)", ErrLeaseLost, h.opts.Ring, v1alpha1.LabelRing, ring)
	}
	return nil
}

// wait waits for d; false when ctx ended first.
func (h *Holder) wait(ctx context.Context, d time.Duration) bool {
	t := h.opts.Clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C():
		return true
	}
}

// lost marks the Lease lost and calls OnLost.
func (h *Holder) lost(err error) error {
	h.held.Store(false)
	h.forget()
	h.log.Error(err, "Lost the instance Lease: the instance must stop reconciling")
	if h.opts.OnLost != nil {
		h.opts.OnLost()
	}
	return err
}

// shutdown calls BeforeRelease while renewing, then releases the Lease.
func (h *Holder) shutdown(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), h.opts.ShutdownTimeout)
	defer cancel()
	if h.opts.BeforeRelease != nil {
		renewCtx, stopRenewing := context.WithCancel(ctx)
		renewed := make(chan error, 1)
		go func() { renewed <- h.renew(renewCtx) }()
		notIdle := h.opts.BeforeRelease(ctx)
		stopRenewing()
		if err := <-renewed; err != nil {
			if notIdle != nil || !errors.Is(err, errRenewDeadline) {
				return h.lost(err)
			}
			// Renewals failed for the renew deadline while the last
			// reconciles ended (a controller stopping on a loaded machine):
			// nothing is in flight any more, so the Lease is still released
			// if nobody else wrote it meanwhile, rather than left for the
			// sharder to wait out.
			h.log.Info("Not renewed within the renew deadline during the shutdown; nothing is in flight, releasing the Lease if it is still ours", "error", err.Error())
			if h.opts.OnLost != nil {
				h.opts.OnLost()
			}
		}
		if notIdle != nil {
			h.held.Store(false)
			h.forget()
			h.log.Error(notIdle, "Not releasing the instance Lease: it expires, and the sharder moves the instance's objects only after two lease durations")
			return nil
		}
	}
	if err := h.release(ctx); err != nil {
		h.held.Store(false)
		h.log.Error(err, "Could not release the instance Lease: the sharder moves the instance's objects once it expires")
		return fmt.Errorf("releasing Lease %s/%s: %w", h.opts.Namespace, h.opts.Identity, err)
	}
	h.log.Info("Released the instance Lease")
	return nil
}

// release empties the holder of the Lease if this holder still holds it.
func (h *Holder) release(ctx context.Context) error {
	defer h.held.Store(false)
	current := h.lease
	for current != nil {
		released := current.DeepCopy()
		released.Spec.HolderIdentity = ptr.To("")
		released.Spec.RenewTime = ptr.To(metav1.NewMicroTime(h.opts.Clock.Now()))
		if h.opts.Release == ReleaseRestart {
			if released.Annotations == nil {
				released.Annotations = map[string]string{}
			}
			released.Annotations[v1alpha1.AnnotationRestarting] = "true"
			if h.opts.Pod != nil {
				// The pod is deleted and created again with the same name:
				// garbage collection must not take the Lease with the old
				// pod, or the next process would find none and wait a lease
				// duration to create it. It sets its own pod as the owner.
				released.OwnerReferences = slices.DeleteFunc(released.OwnerReferences, isPodRef)
			}
		}
		err := h.client.Update(ctx, released)
		switch {
		case err == nil, apierrors.IsNotFound(err):
			h.forget()
			return nil
		case !apierrors.IsConflict(err):
			return err
		}
		// Someone else wrote: release only if the spec is still ours (the
		// sharder may have changed only the state label).
		fresh := &coordinationv1.Lease{}
		if err := h.opts.Reader.Get(ctx, h.key(), fresh); err != nil {
			return client.IgnoreNotFound(err)
		}
		if !h.ours(fresh) {
			h.forget()
			return nil
		}
		current = fresh
	}
	return nil
}

func (h *Holder) key() types.NamespacedName {
	return types.NamespacedName{Namespace: h.opts.Namespace, Name: h.opts.Identity}
}

// tryAcquireOrRenew makes one attempt to hold the Lease. It returns an error
// wrapping ErrLeaseLost when the Lease this holder held was taken.
func (h *Holder) tryAcquireOrRenew(ctx context.Context) (bool, error) {
	if h.opts.Check != nil {
		if err := h.opts.Check(ctx); err != nil {
			return false, fmt.Errorf("%w: %w", errCheckFailed, err)
		}
	}
	now := h.opts.Clock.Now()

	// The usual case: renew the version this holder wrote last.
	if h.lease != nil {
		ok, err := h.write(ctx, h.desired(h.lease, now, false), now)
		if ok || (!apierrors.IsConflict(err) && !apierrors.IsNotFound(err)) {
			return ok, err
		}
	}

	current := &coordinationv1.Lease{}
	if err := h.opts.Reader.Get(ctx, h.key(), current); err != nil {
		if !apierrors.IsNotFound(err) {
			return false, fmt.Errorf("getting the Lease: %w", err)
		}
		if h.lease != nil {
			return false, errDeleted
		}
		// A Lease this holder did not hold: its previous holder (this
		// instance before a restart, or a process still running elsewhere
		// with the same ID) may have lost it moments ago and be stopping.
		if h.missingSince.IsZero() {
			h.missingSince = now
		}
		if createAt := h.missingSince.Add(h.opts.LeaseDuration); now.Before(createAt) {
			return false, fmt.Errorf("no Lease: creating it at %v, a lease duration after finding it missing", createAt)
		}
		created := h.desired(&coordinationv1.Lease{}, now, true)
		h.attempt(created)
		if err := h.client.Create(ctx, created); err != nil {
			return false, fmt.Errorf("creating the Lease: %w", err)
		}
		h.hold(created, now)
		return true, nil
	}

	h.missingSince = time.Time{}
	if h.lease != nil {
		if err := h.leftRing(current); err != nil {
			return false, err
		}
	}
	switch {
	case h.ours(current):
		// Only metadata changed (the sharder's state label): renew on top.
		return h.write(ctx, h.desired(current, now, false), now)
	case h.lease != nil:
		return false, fmt.Errorf("%w: now held by %q", ErrLeaseLost, ptr.Deref(current.Spec.HolderIdentity, ""))
	case !h.acquirable(current, now):
		return false, fmt.Errorf("held by %q: acquiring it once nobody renewed it for %v after %v",
			ptr.Deref(current.Spec.HolderIdentity, ""), membership.DurationOf(current), h.observedAt)
	}
	return h.write(ctx, h.desired(current, now, true), now)
}

// write updates the Lease with the resourceVersion it carries.
func (h *Holder) write(ctx context.Context, lease *coordinationv1.Lease, now time.Time) (bool, error) {
	h.attempt(lease)
	if err := h.client.Update(ctx, lease); err != nil {
		return false, err
	}
	h.hold(lease, now)
	return true, nil
}

// attempt remembers the spec of a write about to be sent.
func (h *Holder) attempt(lease *coordinationv1.Lease) {
	if len(h.unconfirmed) == maxUnconfirmed {
		h.unconfirmed = slices.Delete(h.unconfirmed, 0, 1)
	}
	h.unconfirmed = append(h.unconfirmed, *lease.Spec.DeepCopy())
}

func (h *Holder) hold(lease *coordinationv1.Lease, now time.Time) {
	h.lease = lease
	h.renewedAt = now
	h.unconfirmed = nil
	h.held.Store(true)
}

// forget drops what the holder wrote: the Lease is no longer its.
func (h *Holder) forget() {
	h.lease = nil
	h.unconfirmed = nil
}

// ours reports whether current's spec is one this holder wrote: the last
// confirmed write, or one whose reply never came (it reached the API server
// although the request failed on this side, e.g. a timeout). Holder,
// renewTime and acquireTime, stamped to the microsecond by this process,
// tell it from another process's write.
func (h *Holder) ours(current *coordinationv1.Lease) bool {
	if ptr.Deref(current.Spec.HolderIdentity, "") != h.opts.Identity {
		return false
	}
	if h.lease != nil && sameStamps(&h.lease.Spec, &current.Spec) {
		return true
	}
	for i := range h.unconfirmed {
		if sameStamps(&h.unconfirmed[i], &current.Spec) {
			return true
		}
	}
	return false
}

func sameStamps(a, b *coordinationv1.LeaseSpec) bool {
	return ptr.Deref(a.HolderIdentity, "") == ptr.Deref(b.HolderIdentity, "") &&
		microEqual(a.RenewTime, b.RenewTime) && microEqual(a.AcquireTime, b.AcquireTime)
}

// microEqual compares two stamps as the API server stores them: to the
// microsecond (a spec remembered before sending still has nanoseconds).
func microEqual(a, b *metav1.MicroTime) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Truncate(time.Microsecond).Equal(b.Truncate(time.Microsecond))
}

// acquirable reports whether a Lease this holder does not hold may be
// taken at now. A released Lease (no holder) may be taken at once: the
// sharder moves an instance's objects only while it holds the instance's
// Lease, by a write locked on the released version, so whichever of the two
// writes first wins. Any other Lease may be taken once this holder has
// watched it unrenewed (holder, renewTime, acquireTime and duration alike)
// for its duration, counted on the holder's clock from when it first read
// that version: the times written on the Lease decide nothing.
func (h *Holder) acquirable(lease *coordinationv1.Lease, now time.Time) bool {
	if ptr.Deref(lease.Spec.HolderIdentity, "") == "" {
		return true
	}
	if h.observedAt.IsZero() || !sameRecord(&h.observed, &lease.Spec) {
		h.observed, h.observedAt = *lease.Spec.DeepCopy(), now
	}
	return !now.Before(h.observedAt.Add(membership.DurationOf(lease)))
}

// sameRecord reports whether two Lease specs are the same renewal.
func sameRecord(a, b *coordinationv1.LeaseSpec) bool {
	return sameStamps(a, b) && ptr.Deref(a.LeaseDurationSeconds, 0) == ptr.Deref(b.LeaseDurationSeconds, 0)
}

// isPodRef reports whether ref names a Pod.
func isPodRef(ref metav1.OwnerReference) bool { return ref.Kind == "Pod" && ref.APIVersion == "v1" }

// desired returns base with this holder's labels, owner and spec; acquire
// starts a new hold (acquireTime, transitions).
func (h *Holder) desired(base *coordinationv1.Lease, now time.Time, acquire bool) *coordinationv1.Lease {
	l := base.DeepCopy()
	l.Name, l.Namespace = h.opts.Identity, h.opts.Namespace
	if l.Labels == nil {
		l.Labels = map[string]string{}
	}
	l.Labels[v1alpha1.LabelRing] = h.opts.Ring
	delete(l.Annotations, v1alpha1.AnnotationRestarting)
	if h.opts.VirtualNodes > 0 {
		l.Labels[v1alpha1.LabelVirtualNodes] = fmt.Sprint(h.opts.VirtualNodes)
	} else {
		delete(l.Labels, v1alpha1.LabelVirtualNodes)
	}
	if h.opts.Pod != nil {
		l.OwnerReferences = append([]metav1.OwnerReference{*h.opts.Pod}, slices.DeleteFunc(slices.Clone(l.OwnerReferences), isPodRef)...)
	}
	stamp := ptr.To(metav1.NewMicroTime(now))
	if acquire || l.Spec.AcquireTime == nil {
		if previous := ptr.Deref(l.Spec.HolderIdentity, ""); previous != "" && previous != h.opts.Identity {
			l.Spec.LeaseTransitions = ptr.To(membership.NextTransition(ptr.Deref(l.Spec.LeaseTransitions, 0)))
		}
		l.Spec.AcquireTime = stamp
	}
	l.Spec.HolderIdentity = ptr.To(h.opts.Identity)
	l.Spec.LeaseDurationSeconds = ptr.To(int32(h.opts.LeaseDuration / time.Second)) //nolint:gosec // at most MaxLeaseDuration
	l.Spec.RenewTime = stamp
	return l
}
