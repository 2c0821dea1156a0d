package leasecontroller

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/sharder/metrics"
)

// This file holds what ties Leases and rings together: the mappings between
// the two watches, a Lease's ring, and the "membership" controller, which
// publishes each ring's members into the Registry.

// ringEvents maps the events of a ring to the Leases whose reconcile can
// come out differently after them. A new or deleted ring, and a change of
// its spec, concern all its Leases (leasesOfRing). A write of its status
// alone, which the assignment controller makes up to once per status
// interval, concerns only the members whose entry changed (state, weight or
// object count: the count decides whether the lease controller holds a dead
// instance's Lease) and, when the ring gained its first ready instance or
// lost its last, the dead members: so a status write costs what it
// changed, not a reconcile of every Lease.
func (c *Controller) ringEvents() handler.TypedEventHandler[client.Object, reconcile.Request] {
	return handler.TypedFuncs[client.Object, reconcile.Request]{
		CreateFunc: func(ctx context.Context, e event.TypedCreateEvent[client.Object], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			addAll(q, c.leasesOfRing(ctx, e.Object))
		},
		UpdateFunc: func(ctx context.Context, e event.TypedUpdateEvent[client.Object], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			old, okOld := e.ObjectOld.(*v1alpha1.ControllerRing)
			ring, ok := e.ObjectNew.(*v1alpha1.ControllerRing)
			if !ok || !okOld || specChanged(old, ring) {
				addAll(q, c.leasesOfRing(ctx, e.ObjectNew))
				return
			}
			addAll(q, changedMembers(old, ring))
		},
		DeleteFunc: func(ctx context.Context, e event.TypedDeleteEvent[client.Object], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			addAll(q, c.leasesOfRing(ctx, e.Object))
		},
		GenericFunc: func(ctx context.Context, e event.TypedGenericEvent[client.Object], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			addAll(q, c.leasesOfRing(ctx, e.Object))
		},
	}
}

func addAll(q workqueue.TypedRateLimitingInterface[reconcile.Request], requests []reconcile.Request) {
	for _, r := range requests {
		q.Add(r)
	}
}

// specChanged reports whether a ring changed in more than its status: its
// spec (a new generation), its identity, or its deletion.
func specChanged(old, ring *v1alpha1.ControllerRing) bool {
	return old.UID != ring.UID || old.Generation != ring.Generation || old.Spec.LeaseNamespace != ring.Spec.LeaseNamespace ||
		old.DeletionTimestamp.IsZero() != ring.DeletionTimestamp.IsZero()
}

// changedMembers returns the Leases of the members whose status entry
// differs between old and ring (or is in one only), and of every dead
// member when the ring's having a ready instance changed.
func changedMembers(old, ring *v1alpha1.ControllerRing) []reconcile.Request {
	before := make(map[string]v1alpha1.MemberStatus, len(old.Status.Members))
	for _, m := range old.Status.Members {
		before[m.Name] = m
	}
	readyChanged := (old.Status.AvailableInstances > 0) != (ring.Status.AvailableInstances > 0)
	var requests []reconcile.Request
	add := func(name string) {
		requests = append(requests, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ring.Spec.LeaseNamespace, Name: name}})
	}
	for _, m := range ring.Status.Members {
		was, ok := before[m.Name]
		delete(before, m.Name)
		if !ok || was != m || (readyChanged && (m.State == string(membership.StateDead) || was.State == string(membership.StateDead))) {
			add(m.Name)
		}
	}
	for name := range before {
		add(name)
	}
	return requests
}

// leasesOfRing maps a ring to its Leases in every namespace: when its
// leaseNamespace changes, the Leases left behind lose their state label.
func (c *Controller) leasesOfRing(ctx context.Context, ring client.Object) []reconcile.Request {
	list := &coordinationv1.LeaseList{}
	// Only the names are read: no copies.
	if err := c.client.List(ctx, list, client.MatchingLabels{v1alpha1.LabelRing: ring.GetName()}, client.UnsafeDisableDeepCopy); err != nil {
		logf.FromContext(ctx).Error(err, "Listing the Leases of a ring", "object", klog.KObj(ring))
		return nil
	}
	requests := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		requests = append(requests, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	return requests
}

// ringOfLease maps a Lease to its ring.
func ringOfLease(_ context.Context, lease client.Object) []reconcile.Request {
	ring := lease.GetLabels()[v1alpha1.LabelRing]
	if ring == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: ring}}}
}

// leaseEvents maps the events of a Lease to its ring (old and new), except
// the renewal of an instance published as ready: it stays ready, and its
// next transition only moves later, so the membership cannot change. The
// lease controller observes the renewal all the same (reconcileLease), and
// the ring's requeue at the transition it expected finds the instance
// renewed. So the renewals of a ring's N instances cost no publication of
// its N members each.
func (c *Controller) leaseEvents() handler.TypedEventHandler[client.Object, reconcile.Request] {
	toRing := handler.EnqueueRequestsFromMapFunc(ringOfLease)
	return handler.TypedFuncs[client.Object, reconcile.Request]{
		CreateFunc: toRing.Create,
		UpdateFunc: func(ctx context.Context, e event.TypedUpdateEvent[client.Object], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			old, okOld := e.ObjectOld.(*coordinationv1.Lease)
			lease, ok := e.ObjectNew.(*coordinationv1.Lease)
			if ok && okOld && renewalOnly(old, lease) {
				if m, member := c.opts.Registry.Member(lease.Labels[v1alpha1.LabelRing], lease.Name); member && m.State.Ready() {
					return
				}
			}
			toRing.Update(ctx, e, q)
		},
		DeleteFunc:  toRing.Delete,
		GenericFunc: toRing.Generic,
	}
}

// renewalOnly reports whether lease differs from old in its renewTime (and
// its resourceVersion and managed fields) only: same holder, duration,
// acquire time, labels and annotations.
func renewalOnly(old, lease *coordinationv1.Lease) bool {
	return old.Namespace == lease.Namespace && old.Name == lease.Name && old.UID == lease.UID &&
		ptr.Deref(old.Spec.HolderIdentity, "") == ptr.Deref(lease.Spec.HolderIdentity, "") &&
		ptr.Deref(old.Spec.LeaseDurationSeconds, 0) == ptr.Deref(lease.Spec.LeaseDurationSeconds, 0) &&
		old.Spec.AcquireTime.Equal(lease.Spec.AcquireTime) &&
		maps.Equal(old.Labels, lease.Labels) && maps.Equal(old.Annotations, lease.Annotations) &&
		old.DeletionTimestamp.IsZero() == lease.DeletionTimestamp.IsZero()
}

// ringOf returns the ring the Lease is a member of, or nil when it is not a
// member (no such ring, or the Lease is outside its leaseNamespace).
func (c *Controller) ringOf(ctx context.Context, lease *coordinationv1.Lease) (*v1alpha1.ControllerRing, error) {
	name := lease.Labels[v1alpha1.LabelRing]
	if name == "" {
		return nil, nil
	}
	ring := &v1alpha1.ControllerRing{}
	// The cached ring itself, read only: a copy would copy its status, which
	// lists every member, for each Lease reconciled.
	if err := c.client.Get(ctx, types.NamespacedName{Name: name}, ring, client.UnsafeDisableDeepCopy); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("getting ControllerRing %s: %w", name, err)
	}
	if ring.Spec.LeaseNamespace != lease.Namespace {
		return nil, nil
	}
	return ring, nil
}

// reconcileRing publishes the ring's membership and requeues the ring at the
// earliest next transition of its Leases.
func (c *Controller) reconcileRing(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	name := req.Name
	ring := &v1alpha1.ControllerRing{}
	// The cached ring itself, read only: a copy would copy its status, which
	// lists every member, at each publication.
	if err := c.client.Get(ctx, req.NamespacedName, ring, client.UnsafeDisableDeepCopy); err != nil {
		if apierrors.IsNotFound(err) {
			c.tracker.Forget(name)
			c.publish(ctx, name, nil)
			metrics.ForgetLeaseRing(name)
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, fmt.Errorf("getting ControllerRing %s: %w", name, err)
	}
	now, earliest, err := c.publishRing(ctx, ring)
	if err != nil || earliest.IsZero() {
		return reconcile.Result{}, err
	}
	return reconcile.Result{RequeueAfter: earliest.Sub(now)}, nil
}

// publishRing publishes the ring's membership as the tracker sees it now
// and returns now and the earliest next transition of its Leases. When the
// ring has a ready instance, it asks the lease controller to look at every
// dead instance whose objects cannot move yet, so that it holds their
// Leases and they move.
func (c *Controller) publishRing(ctx context.Context, ring *v1alpha1.ControllerRing) (time.Time, time.Time, error) {
	list := &coordinationv1.LeaseList{}
	// The tracker only reads the Leases: no copies.
	err := c.client.List(ctx, list, client.InNamespace(ring.Spec.LeaseNamespace), client.MatchingLabels{v1alpha1.LabelRing: ring.Name},
		client.UnsafeDisableDeepCopy)
	if err != nil {
		return time.Time{}, time.Time{}, fmt.Errorf("listing the Leases of ring %s: %w", ring.Name, err)
	}
	now := c.opts.Clock.Now()
	c.expectUnlisted(ring.Name, list.Items, now)
	members, earliest := c.tracker.Members(ring.Name, ring.Spec.EffectiveRestartHold(), list.Items, now)
	published := c.publish(ctx, ring.Name, members)
	if c.holdAbsent(ctx, ring, members) {
		// Created Leases to hold: movable now, whether or not the cache
		// has them yet.
		now = c.opts.Clock.Now()
		members, earliest = c.tracker.Members(ring.Name, ring.Spec.EffectiveRestartHold(), list.Items, now)
		published = c.publish(ctx, ring.Name, members) || published
	}
	if published && slices.ContainsFunc(members, func(m membership.Member) bool { return m.State.Ready() }) {
		for _, m := range members {
			if m.State == membership.StateDead && !m.Movable {
				if n, _ := c.opts.Registry.Assigned(ring.Name, m.ID); n > 0 {
					c.wake(types.NamespacedName{Namespace: ring.Spec.LeaseNamespace, Name: m.ID})
				}
			}
		}
	}
	return now, earliest, nil
}

// publishNow publishes the ring's membership after a change of the
// tracker's own (a hold started or ended) rather than of a Lease. A failure
// is only logged: the write of the Lease that goes with the change makes the
// membership controller publish again.
func (c *Controller) publishNow(ctx context.Context, ring *v1alpha1.ControllerRing) {
	if _, _, err := c.publishRing(ctx, ring); err != nil {
		logf.FromContext(ctx).Error(err, "Publishing the membership of a ring", "object", klog.KObj(ring))
	}
}

// wake asks the lease controller to reconcile a Lease; it never blocks.
func (c *Controller) wake(key types.NamespacedName) {
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	select {
	case c.woken <- event.TypedGenericEvent[*coordinationv1.Lease]{Object: lease}:
	default:
		c.logger.V(1).Info("Dropped a request to look at a Lease: the queue is full; it is looked at on its next change", "object", klog.KObj(lease))
	}
}

// wakeRing asks the membership controller to publish a ring again; it
// never blocks.
func (c *Controller) wakeRing(name string) {
	ring := &v1alpha1.ControllerRing{ObjectMeta: metav1.ObjectMeta{Name: name}}
	select {
	case c.ringsWoken <- event.TypedGenericEvent[*v1alpha1.ControllerRing]{Object: ring}:
	default:
		c.logger.WithName("membership").V(1).Info("Dropped a request to publish a ring: the queue is full; it is published on its next change", "ring", name)
	}
}

// publish sets the ring's membership in the Registry and reports whether
// it changed.
func (c *Controller) publish(ctx context.Context, ring string, members []membership.Member) bool {
	if c.opts.Registry.Set(ring, members) {
		logf.FromContext(ctx).V(1).Info("Published ring membership", "ring", ring, "members", len(members))
		return true
	}
	return false
}
