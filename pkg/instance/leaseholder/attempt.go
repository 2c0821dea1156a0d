package leaseholder

import (
	"context"
	"fmt"
	"slices"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/ptr"

	"github.com/sharder-dev/sharder/pkg/membership"
)

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
		ok, err := h.write(ctx, h.holding().Renew(h.lease, now), now)
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
		created := h.holding().Acquire(&coordinationv1.Lease{}, now)
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
		return h.write(ctx, h.holding().Renew(current, now), now)
	case h.lease != nil:
		return false, fmt.Errorf("%w: now held by %q", ErrLeaseLost, ptr.Deref(current.Spec.HolderIdentity, ""))
	case !h.acquirable(current, now):
		return false, fmt.Errorf("held by %q: acquiring it once nobody renewed it for %v after %v",
			ptr.Deref(current.Spec.HolderIdentity, ""), membership.DurationOf(current), h.observedAt)
	}
	return h.write(ctx, h.holding().Acquire(current, now), now)
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
	h.proof.sending(lease.Spec.RenewTime)
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
