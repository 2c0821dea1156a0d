package leaseholder

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// ErrLeaseLost is wrapped by the error Holder.Start returns when the holder
// could not renew its Lease within RenewDeadline, or found it taken, deleted
// or out of its ring.
var ErrLeaseLost = errors.New("instance Lease lost")

// errRenewDeadline reports renewals that failed for the renew deadline.
var errRenewDeadline = fmt.Errorf("%w: not renewed within the renew deadline", ErrLeaseLost)

// errDeleted reports a Lease deleted while held: the sharder no longer sees
// the instance as a member and may move its objects once its hold ends, so
// the instance must stop as on any other loss.
var errDeleted = fmt.Errorf("%w: the Lease was deleted", ErrLeaseLost)

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
	opts   Options
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

	// annotations carries Annotate's requests to the renewal loop; extra
	// holds the annotations asked for, written with every renewal.
	annotations chan *annotation
	extra       map[string]string
	// stopped is closed when Start returns.
	stopped chan struct{}

	// proof is what the watch on the Lease proved: its own guard, since the
	// watch's handler runs on a goroutine of its own.
	proof watchProof
}

// maxUnconfirmed bounds Holder.unconfirmed: attempts between two confirmed
// writes are spaced by a quarter of the renew period and end at the lease
// duration, so a dozen covers them; older ones are forgotten first.
const maxUnconfirmed = 16

var _ manager.LeaderElectionRunnable = &Holder{}

// NewHolder fills in the defaults of opts, checks them and returns a holder
// writing with c. When c is also a client.WithWatch (client.NewWithWatch),
// the holder watches its own Lease by name, which needs list and watch on
// Leases in the namespace besides get, create and update; otherwise it finds
// a vanished Lease at its next renewal.
func NewHolder(c client.Client, opts Options) (*Holder, error) {
	if c == nil {
		return nil, errors.New("lease holder: a client is required")
	}
	if err := opts.setDefaults(c); err != nil {
		return nil, fmt.Errorf("lease holder: %w", err)
	}
	if err := opts.Validate(); err != nil {
		return nil, fmt.Errorf("lease holder: %w", err)
	}
	return &Holder{
		client: c, opts: opts, log: logr.Discard(), woken: make(chan struct{}, 1),
		annotations: make(chan *annotation), stopped: make(chan struct{}),
	}, nil
}

// NeedLeaderElection returns false: every instance holds its own Lease.
func (h *Holder) NeedLeaderElection() bool { return false }

// Identity returns the instance ID.
func (h *Holder) Identity() string { return h.opts.Identity }

// Watching reports whether the holder watches its Lease (its client is a
// client.WithWatch), so that WatchedAt means anything.
func (h *Holder) Watching() bool { return h.opts.watching }

// WatchedAt returns when this holder sent the newest of its writes of the
// Lease that has come back to it through its watch (Clock); zero before
// the first. Watch events arrive in the order of the writes, so the watch
// had delivered every change made before that time: it is at most
// Clock.Since(WatchedAt()) behind. While the holder holds the Lease and
// its watch keeps up, that stays below RenewPeriod plus a round trip.
func (h *Holder) WatchedAt() time.Time { return h.proof.watchedAt() }

// Held reports whether the holder currently holds its Lease. It is false
// before the acquisition, after a loss and after the release.
func (h *Holder) Held() bool { return h.held.Load() }

// Start acquires the Lease, blocking until it is held or ctx is done, then
// renews it until ctx is done. On ctx's end it calls BeforeRelease (renewing
// meanwhile) and releases the Lease as Release says: holderIdentity empty,
// renewTime now, so that the sharder moves the instance's objects at once
// (ReleaseStop) or keeps them for the ring's restartHold (ReleaseRestart).
// When BeforeRelease fails, the Lease is not released but left to expire.
// It returns nil after a release, and an error wrapping ErrLeaseLost after
// calling OnLost. A Holder can be started once.
func (h *Holder) Start(ctx context.Context) error {
	if !h.started.CompareAndSwap(false, true) {
		return errors.New("lease holder: already started")
	}
	defer close(h.stopped)
	h.log = logf.FromContext(ctx).WithValues("lease", klog.KRef(h.opts.Namespace, h.opts.Identity), "ring", h.opts.Ring)

	if !h.acquire(ctx) {
		return h.abandon(ctx)
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
//
// The first renewal is due a renew period after the last one that landed
// started, not after the call: when the shutdown restarts the renewals, it may just
// have cut short an attempt that hung on a slow API server, and by then the
// last renewal is already a renew period old. Waiting a whole period again
// would reach the renew deadline without a single attempt.
func (h *Holder) renew(ctx context.Context) error {
	period := h.untilRenewalDue()
	for {
		due, req, err := h.waitWatching(ctx, period)
		if !due {
			return err
		}
		if req != nil {
			if h.extra == nil {
				h.extra = map[string]string{}
			}
			h.extra[req.key] = req.value
		}
		deadline := h.renewedAt.Add(h.opts.RenewDeadline)
		remaining := deadline.Sub(h.opts.Clock.Now())
		if remaining <= 0 {
			err := fmt.Errorf("%w %v", errRenewDeadline, h.opts.RenewDeadline)
			req.answer(false, err)
			return err
		}
		// An attempt may take the time left until the deadline: on a loaded
		// API server a renewal that answers late still keeps the Lease,
		// where cutting it at the renew period would throw it away and
		// start another just as slow.
		attemptCtx, cancel := context.WithTimeout(ctx, remaining)
		ok, err := h.tryAcquireOrRenew(attemptCtx)
		cancel()
		req.answer(ok, err)
		switch {
		case ok:
			// Due a renew period after this attempt started: a slow
			// answer does not push the next attempt towards the deadline.
			period = h.untilRenewalDue()
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

// untilRenewalDue returns how long until the next renewal is due: a renew
// period after the last one that landed started.
func (h *Holder) untilRenewalDue() time.Duration {
	if h.renewedAt.IsZero() {
		return h.opts.RenewPeriod
	}
	return min(max(h.renewedAt.Add(h.opts.RenewPeriod).Sub(h.opts.Clock.Now()), 0), h.opts.RenewPeriod)
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

func (h *Holder) key() types.NamespacedName {
	return types.NamespacedName{Namespace: h.opts.Namespace, Name: h.opts.Identity}
}
