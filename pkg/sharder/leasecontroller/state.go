package leasecontroller

import (
	"context"
	"fmt"
	"sync"

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

// This file holds what the controller makes visible on a Lease: its state
// label, with an event and a metric for every change, and events on contents
// that keep an instance from its place in the ring.

// patchState sets the sharder.dev/state label to state (removes it when
// state is empty) with a merge patch of the labels, only when it differs,
// and only if the Lease is still at the resourceVersion the state was
// computed from. It returns the Lease as written, or nil when it changed or
// went away meanwhile (not an error: the newer version is reconciled on its
// own).
func (c *Controller) patchState(ctx context.Context, lease *coordinationv1.Lease, state membership.State) (*coordinationv1.Lease, error) {
	old, had := lease.Labels[v1alpha1.LabelState]
	if old == string(state) && had == (state != "") {
		return lease, nil
	}
	patched := membership.WithState(lease, state)
	patch := client.MergeFromWithOptions(lease, client.MergeFromWithOptimisticLock{})
	if err := c.client.Patch(ctx, patched, patch); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("labelling Lease %s with state %q: %w", klog.KObj(lease), state, err)
	}
	if state != "" {
		metrics.LeaseTransitionsTotal.WithLabelValues(lease.Labels[v1alpha1.LabelRing], string(state)).Inc()
		logf.FromContext(ctx).V(1).Info("Instance changed state", "object", klog.KObj(lease), "from", old, "to", state)
		eventType := corev1.EventTypeNormal
		if state == membership.StateExpired || state == membership.StateUncertain {
			eventType = corev1.EventTypeWarning
		}
		c.recorder.Eventf(patched, eventType, "StateChanged", "Instance %s is %s (was %q)", lease.Name, state, old)
	}
	return patched, nil
}

// malformed is a Lease field the instance writes and the sharder parses:
// what it is read by, and what is reported when it is malformed.
type malformed struct {
	reported *sync.Map // per Lease, the malformed value last reported
	value    func(*coordinationv1.Lease) string
	check    func(*coordinationv1.Lease) error
	log      string // the log message
	reason   string // the event's reason
	event    string // the event's message, given the Lease, the ring and the error
}

// report reports lease's value of f once per malformed value, in the log
// and an event on the Lease, and forgets it once the value is well-formed.
func (c *Controller) report(ctx context.Context, ring *v1alpha1.ControllerRing, lease *coordinationv1.Lease, f malformed) {
	key := client.ObjectKeyFromObject(lease)
	err := f.check(lease)
	if err == nil {
		f.reported.Delete(key)
		return
	}
	value := f.value(lease)
	if last, ok := f.reported.Load(key); ok && last == value {
		return
	}
	f.reported.Store(key, value)
	logf.FromContext(ctx).Info(f.log, "object", klog.KObj(lease), "ring", ring.Name, "error", err.Error())
	c.recorder.Eventf(lease, corev1.EventTypeWarning, f.reason, f.event, lease.Name, ring.Name, err)
}

// reportVirtualNodes reports a malformed sharder.dev/virtual-nodes label
// once per value: the instance keeps the ring's default weight.
func (c *Controller) reportVirtualNodes(ctx context.Context, ring *v1alpha1.ControllerRing, lease *coordinationv1.Lease) {
	c.report(ctx, ring, lease, malformed{
		reported: &c.reported,
		value:    func(l *coordinationv1.Lease) string { return l.Labels[v1alpha1.LabelVirtualNodes] },
		check: func(l *coordinationv1.Lease) error {
			_, err := membership.VirtualNodesOf(l)
			return err
		},
		log:    "Ignoring a malformed weight label: the instance keeps the ring's default weight",
		reason: "InvalidVirtualNodes",
		event:  "Instance %s keeps ring %s's default weight: %v",
	})
}

// reportMaxWatchLag reports a malformed sharder.dev/max-watch-lag annotation
// once per value: the sharder takes it as no promise, so objects released
// from the instance by a forced move get the force grace only.
func (c *Controller) reportMaxWatchLag(ctx context.Context, ring *v1alpha1.ControllerRing, lease *coordinationv1.Lease) {
	c.report(ctx, ring, lease, malformed{
		reported: &c.reportedLag,
		value:    func(l *coordinationv1.Lease) string { return l.Annotations[v1alpha1.AnnotationMaxWatchLag] },
		check: func(l *coordinationv1.Lease) error {
			_, err := membership.MaxWatchLagOf(l)
			return err
		},
		log:    "Ignoring a malformed max-watch-lag annotation: the instance promises nothing about its watches",
		reason: "InvalidMaxWatchLag",
		event:  "Instance %s of ring %s promises nothing about its watches: %v",
	})
}

// reportMaxStop reports a malformed sharder.dev/max-stop annotation once per
// value: the sharder takes it as no promise beyond the Lease's margin.
func (c *Controller) reportMaxStop(ctx context.Context, ring *v1alpha1.ControllerRing, lease *coordinationv1.Lease) {
	c.report(ctx, ring, lease, malformed{
		reported: &c.reportedStop,
		value:    func(l *coordinationv1.Lease) string { return l.Annotations[v1alpha1.AnnotationMaxStop] },
		check: func(l *coordinationv1.Lease) error {
			_, err := membership.MaxStopOf(l)
			return err
		},
		log:    "Ignoring a malformed max-stop annotation: the instance promises no bound on stopping beyond its Lease's margin",
		reason: "InvalidMaxStop",
		event:  "Instance %s of ring %s promises no bound on stopping beyond its Lease's margin: %v",
	})
}

// reportInvalid reports a Lease whose name cannot be an instance ID, once.
// The instance never receives objects.
func (c *Controller) reportInvalid(ctx context.Context, ring *v1alpha1.ControllerRing, lease *coordinationv1.Lease) {
	if _, reported := c.invalid.LoadOrStore(lease.UID, true); reported {
		return
	}
	err := membership.InvalidID(lease.Name)
	logf.FromContext(ctx).Info("Ignoring a Lease whose name cannot be an instance ID: it never receives objects",
		"object", klog.KObj(lease), "ring", ring.Name, "error", fmt.Sprint(err))
	c.recorder.Eventf(lease, corev1.EventTypeWarning, "InvalidInstanceID",
		"Lease %s/%s never receives objects of ring %s: %v; give the instance a shorter ID (its pod name or --id)", lease.Namespace, lease.Name, ring.Name, err)
}
