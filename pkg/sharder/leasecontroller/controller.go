package leasecontroller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/sharder-dev/sharder/internal/eventrecorder"
	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/sharder/metrics"
)

// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;update;patch;delete
// +kubebuilder:rbac:groups=sharder.dev,resources=controllerrings,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

// CacheByObject returns the cache setting that limits the manager's Lease
// cache to Leases carrying the sharder.dev/ring label. Merge it into the
// manager's cache.Options.ByObject: a cluster holds one Lease per node and
// one per leader election, none of which the sharder needs to see.
func CacheByObject() map[client.Object]cache.ByObject {
	hasRing, err := labels.NewRequirement(v1alpha1.LabelRing, selection.Exists, nil)
	if err != nil {
		// The key is a constant and valid: this cannot happen.
		panic(fmt.Sprintf("building the %s selector: %v", v1alpha1.LabelRing, err))
	}
	return map[client.Object]cache.ByObject{
		&coordinationv1.Lease{}: {Label: labels.NewSelector().Add(*hasRing)},
	}
}

// sharderIdentityPrefix starts the holder identity of every Lease a sharder
// holds.
const sharderIdentityPrefix = membership.SharderHolderPrefix

// Defaults of ControllerOptions.
const (
	DefaultWorkers = 4
)

// ControllerOptions configures the sharder's lease controller.
type ControllerOptions struct {
	// Registry receives the membership of every ring. Required.
	Registry *Registry

	// Identity is the holder identity the sharder writes into an uncertain
	// Lease it takes. It must differ from every instance ID.
	// Default: "sharder:" + membership.DefaultIdentity(); the colon cannot occur in a
	// Lease name, so the default never equals an instance ID.
	Identity string

	// Clock tells the time for the state computations and takeovers.
	// Default: the real clock.
	Clock clock.PassiveClock

	// Workers is the number of Leases reconciled concurrently.
	// Default: 4.
	Workers int

	// EventRecorder records the events on Leases and rings. It should write
	// core/v1 Events (client-go tools/record), which keep every distinct
	// message. Default: a recorder of its own, component "sharder", stopped
	// with the manager.
	EventRecorder record.EventRecorder
}

// setDefaults fills in the defaults of unset fields.
func (o *ControllerOptions) setDefaults() error {
	if o.Registry == nil {
		return errors.New("lease controller: a Registry is required")
	}
	if o.Identity == "" {
		id, err := membership.DefaultIdentity()
		if err != nil {
			return fmt.Errorf("lease controller: %w", err)
		}
		o.Identity = sharderIdentityPrefix + id
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.Workers <= 0 {
		o.Workers = DefaultWorkers
	}
	return nil
}

// Controller is the sharder's lease controller. It runs on the elected
// sharder only. For every instance Lease of a ring (labelled
// sharder.dev/ring=<ring> in the ring's spec.leaseNamespace) it:
//
//   - writes the state into the sharder.dev/state label, only when it changes
//     and only against the resourceVersion it computed the state from;
//   - takes an uncertain Lease once (holder = Identity, duration twice the
//     Lease's), proving that the API server is reachable and the instance
//     is gone; the Lease is then dead;
//   - deletes an orphaned Lease, preconditioned on its resourceVersion;
//   - requeues the Lease at its next transition, so a state changes when
//     its time comes, not at the next resync;
//   - publishes each ring's members with their states into the Registry
//     whenever they change, including when a ring's leaseNamespace changes or
//     the ring is deleted (its membership then becomes empty).
//
// Leases outside their ring's leaseNamespace, and Leases of rings that do
// not exist, are not members: the controller writes nothing to them except
// removing a sharder.dev/state label it may have written before.
type Controller struct {
	opts     ControllerOptions
	client   client.Client
	recorder record.EventRecorder

	// tracker computes states from the Leases as this sharder observed them,
	// and remembers instances whose Lease vanished.
	tracker membership.Tracker

	// reported holds, per Lease, the malformed virtual-nodes value last
	// reported in an event, so that each value is reported once.
	reported sync.Map
	// invalid holds the Leases reported as having an invalid instance ID.
	invalid sync.Map

	// woken carries Leases to reconcile besides their own changes: dead
	// instances whose objects can move once a ring has a ready instance.
	woken chan event.TypedGenericEvent[*coordinationv1.Lease]
}

// NewController returns a lease controller; SetupWithManager checks the
// options and fills in their defaults.
func NewController(opts ControllerOptions) *Controller {
	return &Controller{opts: opts, woken: make(chan event.TypedGenericEvent[*coordinationv1.Lease], 1024)}
}

// SetupWithManager adds the controller to mgr. The manager's cache should be
// built with CacheByObject, and its scheme must hold the sharder.dev types.
func (c *Controller) SetupWithManager(mgr ctrl.Manager) error {
	if err := c.opts.setDefaults(); err != nil {
		return err
	}
	c.client = mgr.GetClient()
	c.recorder = c.opts.EventRecorder
	if c.recorder == nil {
		rec, err := eventrecorder.New(mgr, "sharder")
		if err != nil {
			return err
		}
		c.recorder = rec
	}

	err := ctrl.NewControllerManagedBy(mgr).
		Named("lease").
		For(&coordinationv1.Lease{}).
		Watches(&v1alpha1.ControllerRing{}, handler.EnqueueRequestsFromMapFunc(c.leasesOfRing)).
		WatchesRawSource(source.Channel(c.woken, &handler.TypedEnqueueRequestForObject[*coordinationv1.Lease]{})).
		WithOptions(controller.Options{MaxConcurrentReconciles: c.opts.Workers}).
		Complete(reconcile.Func(c.reconcileLease))
	if err != nil {
		return fmt.Errorf("setting up the lease controller: %w", err)
	}
	err = ctrl.NewControllerManagedBy(mgr).
		Named("membership").
		For(&v1alpha1.ControllerRing{}).
		Watches(&coordinationv1.Lease{}, handler.EnqueueRequestsFromMapFunc(ringOfLease)).
		Complete(reconcile.Func(c.reconcileRing))
	if err != nil {
		return fmt.Errorf("setting up the membership controller: %w", err)
	}
	return nil
}

// leasesOfRing maps a ring to its Leases in every namespace: when its
// leaseNamespace changes, the Leases left behind lose their state label.
func (c *Controller) leasesOfRing(ctx context.Context, ring client.Object) []reconcile.Request {
	list := &coordinationv1.LeaseList{}
	if err := c.client.List(ctx, list, client.MatchingLabels{v1alpha1.LabelRing: ring.GetName()}); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Listing the Leases of a ring", "ring", ring.GetName())
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

// ringOf returns the ring the Lease is a member of, or nil when it is not a
// member (no such ring, or the Lease is outside its leaseNamespace).
func (c *Controller) ringOf(ctx context.Context, lease *coordinationv1.Lease) (*v1alpha1.ControllerRing, error) {
	name := lease.Labels[v1alpha1.LabelRing]
	if name == "" {
		return nil, nil
	}
	ring := &v1alpha1.ControllerRing{}
	if err := c.client.Get(ctx, types.NamespacedName{Name: name}, ring); err != nil {
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

// reconcileLease brings one Lease's state label, takeover, hold and
// deletion up to date and requeues it at its next transition.
func (c *Controller) reconcileLease(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	lease := &coordinationv1.Lease{}
	if err := c.client.Get(ctx, req.NamespacedName, lease); err != nil {
		if apierrors.IsNotFound(err) {
			c.reported.Delete(req.NamespacedName)
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, fmt.Errorf("getting Lease %s: %w", req, err)
	}
	ring, err := c.ringOf(ctx, lease)
	if err != nil {
		return reconcile.Result{}, err
	}
	if ring == nil {
		// Not a member: drop the state label people might otherwise trust.
		_, err := c.patchState(ctx, lease, "")
		return reconcile.Result{}, err
	}
	c.reportVirtualNodes(ctx, ring, lease)

	restartHold := ring.Spec.EffectiveRestartHold()
	now := c.opts.Clock.Now()
	member, next := c.tracker.Observe(ring.Name, restartHold, lease, now)
	state := member.State
	switch state {
	case membership.StateInvalid:
		c.reportInvalid(ctx, ring, lease)
	case membership.StateUncertain:
		// Label it first: the state stays visible if the takeover fails.
		if lease, err = c.patchState(ctx, lease, state); err != nil || lease == nil {
			return reconcile.Result{}, err
		}
		taken, err := c.take(ctx, ring, lease)
		if err != nil || taken == nil {
			return reconcile.Result{}, err
		}
		metrics.LeaseTakeoversTotal.WithLabelValues(ring.Name).Inc()
		log.Info("Took the Lease of an instance that stopped renewing: it is dead", "lease", klog.KObj(lease), "ring", ring.Name)
		c.recorder.Eventf(taken, corev1.EventTypeWarning, "InstanceDead",
			"Instance %s of ring %s did not renew its Lease for twice its duration; the sharder took the Lease", lease.Name, ring.Name)
		lease = taken
		member, next = c.tracker.Observe(ring.Name, restartHold, lease, now)
		state = member.State
	case membership.StateOrphaned:
		return reconcile.Result{}, c.deleteOrphan(ctx, ring, lease)
	}
	if state == membership.StateDead {
		held, again, err := c.holdForMoves(ctx, ring, lease)
		if err != nil || held == nil {
			return reconcile.Result{}, err
		}
		if held != lease {
			lease = held
			now = c.opts.Clock.Now()
			member, next = c.tracker.Observe(ring.Name, restartHold, lease, now)
			state = member.State
		}
		if again > 0 && (next.IsZero() || now.Add(again).Before(next)) {
			next = now.Add(again)
		}
	}

	if _, err := c.patchState(ctx, lease, state); err != nil {
		return reconcile.Result{}, err
	}
	if next.IsZero() {
		return reconcile.Result{}, nil
	}
	return reconcile.Result{RequeueAfter: next.Sub(now)}, nil
}

// take acquires an uncertain Lease for the sharder with twice its duration.
// It returns nil and no error when the Lease changed meanwhile (the newer
// version is reconciled on its own).
func (c *Controller) take(ctx context.Context, ring *v1alpha1.ControllerRing, lease *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	taken := lease.DeepCopy()
	now := c.opts.Clock.Now()
	hold := membership.TakeoverFactor * membership.DurationOf(lease)
	taken.Spec.HolderIdentity = ptr.To(c.opts.Identity)
	taken.Spec.LeaseDurationSeconds = ptr.To(int32(hold / time.Second)) //nolint:gosec // at most 2 × MaxLeaseDuration
	taken.Spec.AcquireTime = ptr.To(metav1.NewMicroTime(now))
	taken.Spec.RenewTime = ptr.To(metav1.NewMicroTime(now))
	taken.Spec.LeaseTransitions = ptr.To(membership.NextTransition(ptr.Deref(lease.Spec.LeaseTransitions, 0)))
	// Update sends the resourceVersion the state was computed from: if the
	// instance renewed meanwhile, the takeover fails with a conflict.
	if err := c.client.Update(ctx, taken); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("taking Lease %s: %w", klog.KObj(lease), err)
	}
	c.tracker.Hold(ring.Name, lease.Name, now, hold)
	c.publishRing(ctx, ring)
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
	ctrl.LoggerFrom(ctx).Info("Deleted an orphaned Lease", "lease", klog.KObj(lease), "ring", ring.Name)
	c.recorder.Eventf(ring, corev1.EventTypeNormal, "LeaseDeleted",
		"Deleted Lease %s/%s of instance %s: dead for ten lease durations", lease.Namespace, lease.Name, lease.Name)
	return nil
}

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
	patched := lease.DeepCopy()
	if state == "" {
		delete(patched.Labels, v1alpha1.LabelState)
	} else {
		if patched.Labels == nil {
			patched.Labels = map[string]string{}
		}
		patched.Labels[v1alpha1.LabelState] = string(state)
	}
	patch := client.MergeFromWithOptions(lease, client.MergeFromWithOptimisticLock{})
	if err := c.client.Patch(ctx, patched, patch); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("labelling Lease %s with state %q: %w", klog.KObj(lease), state, err)
	}
	if state != "" {
		metrics.LeaseTransitionsTotal.WithLabelValues(lease.Labels[v1alpha1.LabelRing], string(state)).Inc()
		ctrl.LoggerFrom(ctx).V(1).Info("Instance changed state", "lease", klog.KObj(lease), "from", old, "to", state)
		eventType := corev1.EventTypeNormal
		if state == membership.StateExpired || state == membership.StateUncertain {
			eventType = corev1.EventTypeWarning
		}
		c.recorder.Eventf(patched, eventType, "StateChanged", "Instance %s is %s (was %q)", lease.Name, state, old)
	}
	return patched, nil
}

// reportVirtualNodes reports a malformed sharder.dev/virtual-nodes label
// once per value: the instance keeps the ring's default weight.
func (c *Controller) reportVirtualNodes(ctx context.Context, ring *v1alpha1.ControllerRing, lease *coordinationv1.Lease) {
	key := client.ObjectKeyFromObject(lease)
	_, err := membership.VirtualNodesOf(lease)
	if err == nil {
		c.reported.Delete(key)
		return
	}
	value := lease.Labels[v1alpha1.LabelVirtualNodes]
	if last, ok := c.reported.Load(key); ok && last == value {
		return
	}
	c.reported.Store(key, value)
	ctrl.LoggerFrom(ctx).Info("Ignoring a malformed weight label: the instance keeps the ring's default weight",
		"lease", klog.KObj(lease), "ring", ring.Name, "error", err.Error())
	c.recorder.Eventf(lease, corev1.EventTypeWarning, "InvalidVirtualNodes",
		"Instance %s keeps ring %s's default weight: %v", lease.Name, ring.Name, err)
}

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
	if holder != "" && !strings.HasPrefix(holder, membership.SharderHolderPrefix) {
		return lease, 0, nil // taken by someone else: not the sharder's to hold
	}
	d := membership.DurationOf(lease)
	n, counted := c.opts.Registry.Assigned(ring.Name, lease.Name)
	if !counted {
		return lease, d / 3, nil
	}
	if n == 0 || !c.opts.Registry.HasReady(ring.Name) {
		if holder == "" {
			return lease, 0, nil
		}
		return c.releaseHold(ctx, ring, lease, n)
	}
	now := c.opts.Clock.Now()
	if holder == c.opts.Identity {
		if heldAt := c.tracker.HeldAt(ring.Name, lease.Name); !heldAt.IsZero() {
			if renewAt := heldAt.Add(d / 3); now.Before(renewAt) {
				return lease, renewAt.Sub(now), nil
			}
		}
	}
	held := lease.DeepCopy()
	held.Spec.HolderIdentity = ptr.To(c.opts.Identity)
	held.Spec.RenewTime = ptr.To(metav1.NewMicroTime(now))
	if holder != c.opts.Identity {
		held.Spec.AcquireTime = ptr.To(metav1.NewMicroTime(now))
		held.Spec.LeaseTransitions = ptr.To(membership.NextTransition(ptr.Deref(lease.Spec.LeaseTransitions, 0)))
	}
	// Held, the Lease no longer says the instance is restarting: released
	// again later, its instance takes it back as from any stop.
	delete(held.Annotations, v1alpha1.AnnotationRestarting)
	if err := c.client.Update(ctx, held); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return nil, 0, nil
		}
		return nil, 0, fmt.Errorf("holding Lease %s while its objects move: %w", klog.KObj(lease), err)
	}
	c.tracker.Hold(ring.Name, lease.Name, now, d)
	if holder != c.opts.Identity {
		ctrl.LoggerFrom(ctx).Info("Holding the Lease of a dead instance while its objects move", "lease", klog.KObj(lease), "ring", ring.Name, "objects", n)
		c.publishRing(ctx, ring)
	}
	return held, d / 3, nil
}

// releaseHold ends the sharder's hold of a dead instance's Lease: the
// instance's objects stop being movable at once, and the Lease is released
// (no holder) so that the instance, should it come back, acquires it at
// once.
func (c *Controller) releaseHold(ctx context.Context, ring *v1alpha1.ControllerRing, lease *coordinationv1.Lease, objects int32) (*coordinationv1.Lease, time.Duration, error) {
	c.tracker.Unhold(ring.Name, lease.Name)
	c.publishRing(ctx, ring)
	released := lease.DeepCopy()
	released.Spec.HolderIdentity = ptr.To("")
	released.Spec.RenewTime = ptr.To(metav1.NewMicroTime(c.opts.Clock.Now()))
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
	ctrl.LoggerFrom(ctx).Info("Released the Lease of a dead instance: "+reason, "lease", klog.KObj(lease), "ring", ring.Name, "objects", objects)
	return released, 0, nil
}

// reportInvalid reports a Lease whose name cannot be an instance ID, once.
// The instance never receives objects.
func (c *Controller) reportInvalid(ctx context.Context, ring *v1alpha1.ControllerRing, lease *coordinationv1.Lease) {
	if _, reported := c.invalid.LoadOrStore(lease.UID, true); reported {
		return
	}
	err := membership.InvalidID(lease.Name)
	ctrl.LoggerFrom(ctx).Info("Ignoring a Lease whose name cannot be an instance ID: it never receives objects",
		"lease", klog.KObj(lease), "ring", ring.Name, "error", fmt.Sprint(err))
	c.recorder.Eventf(lease, corev1.EventTypeWarning, "InvalidInstanceID",
		"Lease %s/%s never receives objects of ring %s: %v; give the instance a shorter ID (its pod name or --id)", lease.Namespace, lease.Name, ring.Name, err)
}

// reconcileRing publishes the ring's membership and requeues the ring at the
// earliest next transition of its Leases.
func (c *Controller) reconcileRing(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	name := req.Name
	ring := &v1alpha1.ControllerRing{}
	if err := c.client.Get(ctx, req.NamespacedName, ring); err != nil {
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
	err := c.client.List(ctx, list, client.InNamespace(ring.Spec.LeaseNamespace), client.MatchingLabels{v1alpha1.LabelRing: ring.Name})
	if err != nil {
		return time.Time{}, time.Time{}, fmt.Errorf("listing the Leases of ring %s: %w", ring.Name, err)
	}
	now := c.opts.Clock.Now()
	members, earliest := c.tracker.Members(ring.Name, ring.Spec.EffectiveRestartHold(), list.Items, now)
	if c.publish(ctx, ring.Name, members) && slices.ContainsFunc(members, func(m membership.Member) bool { return m.State.Ready() }) {
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

// wake asks the lease controller to reconcile a Lease; it never blocks.
func (c *Controller) wake(key types.NamespacedName) {
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	select {
	case c.woken <- event.TypedGenericEvent[*coordinationv1.Lease]{Object: lease}:
	default:
		ctrl.Log.WithName("lease").V(1).Info("Dropped a request to look at a Lease: the queue is full; it is looked at on its next change", "lease", klog.KObj(lease))
	}
}

func (c *Controller) publish(ctx context.Context, ring string, members []membership.Member) bool {
	if c.opts.Registry.Set(ring, members) {
		ctrl.LoggerFrom(ctx).V(1).Info("Published ring membership", "ring", ring, "members", len(members))
		return true
	}
	return false
}
