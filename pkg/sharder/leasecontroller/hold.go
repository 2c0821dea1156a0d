package leasecontroller

import (
	"context"
	"fmt"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
)

// releaseRetry is how soon releaseHold looks again when it cannot release
// a Lease yet.
const releaseRetry = 100 * time.Millisecond

// holdForMoves holds the Lease of a dead instance while its objects can
// move: while objects still carry the instance's shard label and the ring
// has a ready instance to move them to. The sharder takes the Lease (a
// write locked on the resourceVersion it read, so an instance that took
// its Lease back first wins) and renews it every third of its duration;
// the assignment moves the instance's objects only while that hold is
// recorded (Member.Movable), and an instance with the same ID (a restarted
// pod) cannot acquire the Lease before it has watched it unrenewed for its
// duration, so it never starts on objects that are being moved away.
//
// When no move can happen (no object left, or no ready instance to move
// them to) the sharder releases a Lease it or a previous leader held: an
// instance with the same ID acquires a released Lease at once. So a ring
// whose instances all went away never stalls: their objects stay where
// they are, and each instance takes its Lease and its objects back when
// it returns.
//
// Until the assignment engine has counted the ring's objects (the first
// second after the sharder starts) it changes nothing but looks again a
// third of a lease duration later. It returns the Lease as it is now (nil
// when it changed meanwhile) and when to look at it again (0: only on a
// change).
func (c *Controller) holdForMoves(ctx context.Context, ring *v1alpha1.ControllerRing, lease *coordinationv1.Lease) (*coordinationv1.Lease, time.Duration, error) {
	holder := ptr.Deref(lease.Spec.HolderIdentity, "")
	// Taken by somebody other than the instance and a sharder: not the
	// sharder's to release, and taken only as any candidate may take it.
	foreign := holder != "" && !strings.HasPrefix(holder, membership.SharderHolderPrefix)
	d := membership.DurationOf(lease)
	n, counted := c.opts.Registry.Assigned(ring.Name, lease.Name)
	if !counted {
		return lease, d / 3, nil
	}
	if n == 0 || !c.opts.Registry.HasReady(ring.Name) {
		if holder == "" || foreign {
			return lease, 0, nil
		}
		return c.releaseHold(ctx, ring, lease, n)
	}
	now := c.opts.Clock.Now()
	if foreign {
		// Whoever holds it may stop renewing, and the instance then acquire
		// it once it has watched it unrenewed for its duration: the sharder
		// takes it under the same rule, after watching it unrenewed for its
		// duration, and moves the objects only under its own hold.
		if since := c.tracker.ObservedSince(ring.Name, lease.Name); !since.IsZero() {
			if at := since.Add(d); now.Before(at) {
				return lease, at.Sub(now), nil
			}
		}
	}
	if holder == c.opts.Identity {
		if heldAt := c.tracker.HeldAt(ring.Name, lease.Name); !heldAt.IsZero() {
			// Renewed before the objects stop being movable, with room
			// for the write.
			if renewAt := heldAt.Add(min(d/3, c.tracker.MovableFor(d)/2)); now.Before(renewAt) {
				return lease, renewAt.Sub(now), nil
			}
		}
	}
	held := membership.Hold(lease, c.opts.Identity, now)
	if err := c.client.Update(ctx, held); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return nil, 0, nil
		}
		return nil, 0, fmt.Errorf("holding Lease %s while its objects move: %w", klog.KObj(lease), err)
	}
	c.tracker.Hold(ring.Name, lease.Name, now, d)
	if holder != c.opts.Identity {
		log := logf.FromContext(ctx)
		if foreign {
			log.Info("Took the Lease of a dead instance from another holder that left it unrenewed for its duration", "object", klog.KObj(lease), "ring", ring.Name, "holder", holder)
			c.recorder.Eventf(ring, corev1.EventTypeWarning, "LeaseTakenFromOtherHolder",
				"Lease %s/%s of instance %s was held by %q, who left it unrenewed for %s; the sharder took it to move the instance's objects", lease.Namespace, lease.Name, lease.Name, holder, d)
		}
		log.Info("Holding the Lease of a dead instance while its objects move", "object", klog.KObj(lease), "ring", ring.Name, "objects", n)
		c.publishNow(ctx, ring)
	}
	return held, min(d/3, c.tracker.MovableFor(d)/2), nil
}

// releaseHold ends the sharder's hold of a dead instance's Lease: the
// instance's objects stop being movable at once, and the Lease is released
// (no holder) so that the instance, should it come back, acquires it at
// once. The release waits until the assignment engine can no longer send a
// move of the instance's objects and none it sent is in flight
// (Registry.BeginMove): a move decided under the hold that landed after the
// instance took its Lease back would pull an object from under it without a
// drain. Moves return within the sharder's write timeout, so the wait is
// short.
func (c *Controller) releaseHold(ctx context.Context, ring *v1alpha1.ControllerRing, lease *coordinationv1.Lease, objects int32) (*coordinationv1.Lease, time.Duration, error) {
	c.tracker.Unhold(ring.Name, lease.Name)
	c.publishNow(ctx, ring)
	if m, ok := c.opts.Registry.Member(ring.Name, lease.Name); ok && m.Movable {
		// Not published (the Leases could not be listed): moves may still
		// begin. The hold the Lease shows stays until it is.
		return lease, releaseRetry, nil
	}
	if n := c.opts.Registry.MovesInFlight(ring.Name, lease.Name); n > 0 {
		logf.FromContext(ctx).V(1).Info("Releasing the Lease of a dead instance once the moves of its objects in flight returned",
			"object", klog.KObj(lease), "ring", ring.Name, "moves", n)
		return lease, releaseRetry, nil
	}
	released := membership.Release(lease, c.opts.Clock.Now())
	if err := c.client.Update(ctx, released); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return nil, 0, nil
		}
		return nil, 0, fmt.Errorf("releasing the hold of Lease %s: %w", klog.KObj(lease), err)
	}
	reason := "its objects have moved"
	if objects > 0 {
		reason = "no instance is ready to take its objects"
	}
	logf.FromContext(ctx).Info("Released the Lease of a dead instance: "+reason, "object", klog.KObj(lease), "ring", ring.Name, "objects", objects)
	return released, 0, nil
}
