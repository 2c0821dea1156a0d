package leasecontroller

import (
	"context"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
)

// This file holds the sharder's hold of instances whose Lease is absent:
// deleted (kubectl delete lease, or garbage collection with a force-deleted
// pod), or never seen by this sharder (deleted before it led, or a label
// written by hand). Their objects move only once the sharder created the
// Lease and holds it, as it holds a released or taken one: a process with
// the instance's ID then finds the Lease held and waits, as it waits for
// any held Lease, instead of creating it and starting on objects that are
// being moved away (docs/design.md §3).

// expectUnlisted makes every instance that holds objects of ring (as the
// assignment engine or the slot table counted them) but has no Lease among
// leases, and that the tracker does not know, a member whose Lease is
// absent: vanished for Options.UnknownHold (by default twice the
// longest lease duration of the ring's Leases, or of the default when it
// has none), then dead.
func (c *Controller) expectUnlisted(ring string, leases []coordinationv1.Lease, now time.Time) {
	ids := c.opts.Registry.AssignedTo(ring)
	if len(ids) == 0 {
		return
	}
	present := make(map[string]bool, len(leases))
	d, stop := time.Duration(0), time.Duration(0)
	for i := range leases {
		present[leases[i].Name] = true
		d = max(d, membership.DurationOf(&leases[i]))
		if s, err := membership.MaxStopOf(&leases[i]); err == nil {
			stop = max(stop, s)
		}
	}
	if d == 0 {
		d = membership.DefaultLeaseDuration
	}
	hold := c.opts.UnknownHold
	if hold == 0 {
		hold = membership.GoneAfter(d, stop)
	}
	for _, id := range ids {
		if !present[id] {
			c.tracker.Expect(ring, id, d, hold, now)
		}
	}
}

// holdAbsent creates, held by the sharder, the Lease of every dead member
// of ring whose Lease is absent, that still has objects and whose objects
// can move (the ring has a ready instance). The Lease carries the duration
// last seen on it and the ring's label; the create fails when a process with
// the instance's ID created it first, and then nothing moves: the instance
// is back. It reports whether it created any.
func (c *Controller) holdAbsent(ctx context.Context, ring *v1alpha1.ControllerRing, members []membership.Member) bool {
	ready := false
	for _, m := range members {
		ready = ready || m.State.Ready()
	}
	if !ready {
		return false
	}
	created := false
	for _, m := range members {
		if m.State != membership.StateDead || m.Movable || !c.tracker.Absent(ring.Name, m.ID) {
			continue
		}
		if n, _ := c.opts.Registry.Assigned(ring.Name, m.ID); n == 0 {
			continue
		}
		if c.createHeld(ctx, ring, m.ID) {
			created = true
		}
	}
	return created
}

// createHeld creates the Lease of instance id of ring, held by the sharder,
// and records the hold. It reports whether the Lease was created.
func (c *Controller) createHeld(ctx context.Context, ring *v1alpha1.ControllerRing, id string) bool {
	log := logf.FromContext(ctx)
	d := max(c.tracker.LastDuration(ring.Name, id).Truncate(time.Second), time.Second)
	now := c.opts.Clock.Now()
	lease := membership.NewHeld(ring.Spec.LeaseNamespace, id, ring.Name, c.opts.Identity, d, now)
	if err := c.client.Create(ctx, lease); err != nil {
		if !apierrors.IsAlreadyExists(err) {
			log.Error(err, "Creating the Lease of a gone instance to hold it while its objects move; its objects stay where they are",
				"object", klog.KObj(lease), "ring", ring.Name)
			return false
		}
		// Created meanwhile (the instance is back: its own reconcile
		// decides), or it exists outside the ring.
		return c.takeOutside(ctx, ring, lease)
	}
	c.tracker.Hold(ring.Name, id, now, d)
	n, _ := c.opts.Registry.Assigned(ring.Name, id)
	log.Info("Created and holding the Lease of an instance whose Lease is gone, while its objects move", "object", klog.KObj(lease), "ring", ring.Name, "objects", n)
	c.recorder.Eventf(ring, corev1.EventTypeNormal, "LeaseCreated",
		"Instance %s has no Lease and is gone; the sharder created its Lease %s/%s and holds it while its objects move", id, lease.Namespace, lease.Name)
	return true
}

// takeOutside holds the Lease of instance want.Name of ring when it exists
// but not in the ring: its sharder.dev/ring label was removed. A process
// with the instance's ID that acquires it puts the label back, so it is the
// instance's Lease all the same: the sharder takes it, as want, with the
// ring's label, locked on the resourceVersion it read, so that a process
// that acquired it first wins. A Lease labelled for another ring is that
// ring's: it is reported, and the instance's objects stay where they are
// until the Lease comes back to the ring or is deleted. It reports whether
// the sharder holds the Lease.
func (c *Controller) takeOutside(ctx context.Context, ring *v1alpha1.ControllerRing, want *coordinationv1.Lease) bool {
	log := logf.FromContext(ctx)
	current := &coordinationv1.Lease{}
	if err := c.reader.Get(ctx, client.ObjectKeyFromObject(want), current); err != nil {
		if !apierrors.IsNotFound(err) {
			log.Error(err, "Reading the Lease of a gone instance", "object", klog.KObj(want), "ring", ring.Name)
		}
		return false
	}
	switch other := current.Labels[v1alpha1.LabelRing]; {
	case other == ring.Name:
		return false // in the ring: its own reconcile decides
	case other != "":
		log.Info("The Lease of a gone instance belongs to another ring; its objects stay where they are", "object", klog.KObj(current), "ring", ring.Name, "otherRing", other)
		c.recorder.Eventf(ring, corev1.EventTypeWarning, "LeaseInOtherRing",
			"Instance %s of this ring is gone, but its Lease %s/%s is labelled for ring %q: its objects stay where they are until the Lease is back in this ring or deleted", current.Name, current.Namespace, current.Name, other)
		return false
	}
	now := c.opts.Clock.Now()
	taken := membership.HoldInRing(current, ring.Name, c.opts.Identity, time.Duration(membership.RecordOf(want).DurationSeconds)*time.Second, now)
	if err := c.client.Update(ctx, taken); err != nil {
		if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			log.Error(err, "Taking the Lease of a gone instance back into its ring", "object", klog.KObj(current), "ring", ring.Name)
		}
		return false
	}
	d := membership.DurationOf(taken)
	c.tracker.Hold(ring.Name, taken.Name, now, d)
	n, _ := c.opts.Registry.Assigned(ring.Name, taken.Name)
	log.Info("Took the Lease of a gone instance back into its ring and holding it while its objects move", "object", klog.KObj(taken), "ring", ring.Name, "objects", n)
	c.recorder.Eventf(ring, corev1.EventTypeNormal, "LeaseCreated",
		"Instance %s lost its Lease's ring label and is gone; the sharder labelled its Lease %s/%s for the ring again and holds it while its objects move", taken.Name, taken.Namespace, taken.Name)
	return true
}
