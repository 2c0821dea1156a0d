package leasecontroller

import (
	"context"
	"fmt"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/sharder/metrics"
)

// This file holds the two writes that end an instance's time in a ring: the
// takeover of an uncertain Lease, after which the instance is dead, and the
// deletion of an orphaned one, after which it is gone.

// take acquires an uncertain Lease for the sharder with twice its duration
// (membership.Take). It returns nil and no error when the Lease changed
// meanwhile (the newer version is reconciled on its own).
func (c *Controller) take(ctx context.Context, ring *v1alpha1.ControllerRing, lease *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	now := c.opts.Clock.Now()
	taken := membership.Take(lease, c.opts.Identity, now)
	// Update sends the resourceVersion the state was computed from: if the
	// instance renewed meanwhile, the takeover fails with a conflict.
	if err := c.client.Update(ctx, taken); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("taking Lease %s: %w", klog.KObj(lease), err)
	}
	c.tracker.Hold(ring.Name, lease.Name, now, membership.TakeoverFactor*membership.DurationOf(lease))
	c.publishNow(ctx, ring)
	return taken, nil
}

// deleteOrphan deletes an orphaned Lease unless it changed meanwhile.
func (c *Controller) deleteOrphan(ctx context.Context, ring *v1alpha1.ControllerRing, lease *coordinationv1.Lease) error {
	err := c.client.Delete(ctx, lease, client.Preconditions{UID: &lease.UID, ResourceVersion: &lease.ResourceVersion})
	switch {
	case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
		return nil
	case err != nil:
		return fmt.Errorf("deleting orphaned Lease %s: %w", klog.KObj(lease), err)
	}
	metrics.LeasesDeletedTotal.WithLabelValues(ring.Name).Inc()
	logf.FromContext(ctx).Info("Deleted an orphaned Lease", "object", klog.KObj(lease), "ring", ring.Name)
	c.recorder.Eventf(ring, corev1.EventTypeNormal, "LeaseDeleted",
		"Deleted Lease %s/%s of instance %s: dead for ten lease durations", lease.Namespace, lease.Name, lease.Name)
	return nil
}
