package leaseholder

import (
	"context"
	"errors"
	"fmt"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

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
		released := h.opts.releasedLease(current, h.opts.Clock.Now())
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
