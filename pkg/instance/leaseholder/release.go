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

// abandon ends an acquisition that ctx cut short. An attempt whose reply
// never came may have landed: the API server, the sharder and the other
// instances then see the Lease held, and the sharder assigns the instance
// objects it will never reconcile. So when such an attempt exists, abandon
// reads the Lease and releases it if it carries one of them. Nothing was
// reconciled yet, so nothing waits on BeforeRelease.
func (h *Holder) abandon(ctx context.Context) error {
	if len(h.unconfirmed) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), h.opts.ShutdownTimeout)
	defer cancel()
	current := &coordinationv1.Lease{}
	if err := h.opts.Reader.Get(ctx, h.key(), current); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		h.log.Error(err, "Stopped while acquiring the instance Lease and could not read it: if the acquisition landed, the sharder moves the instance's objects once it expires")
		return fmt.Errorf("reading Lease %s/%s after a cut acquisition: %w", h.opts.Namespace, h.opts.Identity, err)
	}
	if !h.ours(current) {
		h.forget()
		return nil
	}
	if err := h.releaseFrom(ctx, current); err != nil {
		h.log.Error(err, "Stopped while acquiring the instance Lease and could not release it: the sharder moves the instance's objects once it expires")
		return fmt.Errorf("releasing Lease %s/%s: %w", h.opts.Namespace, h.opts.Identity, err)
	}
	h.log.Info("Stopped while acquiring the instance Lease; released the acquisition that had landed")
	return nil
}

// release empties the holder of the Lease if this holder still holds it.
func (h *Holder) release(ctx context.Context) error {
	return h.releaseFrom(ctx, h.lease)
}

// releaseFrom releases the Lease, starting from current, a version this
// holder wrote (nil: nothing to release).
func (h *Holder) releaseFrom(ctx context.Context, current *coordinationv1.Lease) error {
	defer h.held.Store(false)
	for current != nil {
		released := h.holding().Release(current, h.opts.Clock.Now(), h.opts.Release == ReleaseRestart)
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
