package leases

import (
	"context"
	"errors"
	"fmt"
	"math"
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
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/sharder-dev/sharder/internal/eventrecorder"
	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/metrics"
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
// holds; a colon cannot occur in a Lease name, so no instance ID has it.
const sharderIdentityPrefix = "sharder:"

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
	// Default: "sharder:" + DefaultIdentity(); the colon cannot occur in a
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
		id, err := DefaultIdentity()
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
}

// NewController returns a lease controller; SetupWithManager checks the
// options and fills in their defaults.
func NewController(opts ControllerOptions) *Controller {
	return &Controller{opts: opts}
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

// reconcileLease brings one Lease's state label, takeover and deletion up to
// date and requeues it at its next transition.
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

	now := c.opts.Clock.Now()
	member, next := c.tracker.Observe(ring.Name, lease, now)
	state := member.State
	switch state {
	case membership.StateInvalid:
		c.reportInvalid(ctx, ring, lease)
	case membership.StateUncertain:
		// Label it first: the state stays visible if the takeover fails.
		if lease, err = c.patchState(ctx, lease, state); err != nil || lease == nil {
			return reconcile.Result{}, err
		}
		taken, err := c.take(ctx, lease, now)
		if err != nil || taken == nil {
			return reconcile.Result{}, err
		}
		metrics.LeaseTakeoversTotal.WithLabelValues(ring.Name).Inc()
		log.Info("Took the Lease of an instance that stopped renewing: it is dead", "lease", klog.KObj(lease), "ring", ring.Name)
		c.recorder.Eventf(taken, corev1.EventTypeWarning, "InstanceDead",
			"Instance %s of ring %s did not renew its Lease for twice its duration; the sharder took the Lease and moves its objects", lease.Name, ring.Name)
		lease = taken
		member, next = c.tracker.Observe(ring.Name, lease, now)
		state = member.State
	case membership.StateOrphaned:
		return reconcile.Result{}, c.deleteOrphan(ctx, ring, lease)
	}
	if state == membership.StateDead {
		held, again, err := c.holdWhileMoving(ctx, ring, lease, now)
		if err != nil || held == nil {
			return reconcile.Result{}, err
		}
		if held != lease {
			lease = held
			member, next = c.tracker.Observe(ring.Name, lease, now)
			state = member.State
		}
		if again && (next.IsZero() || now.Add(membership.DurationOf(lease)/3).Before(next)) {
			next = now.Add(membership.DurationOf(lease) / 3)
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
func (c *Controller) take(ctx context.Context, lease *coordinationv1.Lease, now time.Time) (*coordinationv1.Lease, error) {
	taken := lease.DeepCopy()
	hold := membership.TakeoverFactor * membership.DurationOf(lease)
	taken.Spec.HolderIdentity = ptr.To(c.opts.Identity)
	taken.Spec.LeaseDurationSeconds = ptr.To(int32(hold / time.Second)) //nolint:gosec // at most 2 × MaxLeaseDuration
	taken.Spec.AcquireTime = ptr.To(metav1.NewMicroTime(now))
	taken.Spec.RenewTime = ptr.To(metav1.NewMicroTime(now))
	taken.Spec.LeaseTransitions = ptr.To(nextTransition(ptr.Deref(lease.Spec.LeaseTransitions, 0)))
	// Update sends the resourceVersion the state was computed from: if the
	// instance renewed meanwhile, the takeover fails with a conflict.
	if err := c.client.Update(ctx, taken); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("taking Lease %s: %w", klog.KObj(lease), err)
	}
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

// holdWhileMoving keeps the Lease of a dead instance held by the sharder
// while objects still carry the instance's shard label, so that an
// instance with the same ID (a restarted pod) cannot acquire it and start
// on objects that are being moved away from it. A released Lease is taken
// (keeping its duration) and renewed every third of its duration until
// the assignment engine counts no object on the instance; then the hold
// expires and the instance may acquire the Lease one lease duration later.
// Until the assignment engine has counted the ring's objects (the first
// second after the sharder starts), it holds nothing but looks again a
// third of a lease duration later. It returns the Lease as it is now (nil
// when it changed meanwhile) and whether to look at it again then.
func (c *Controller) holdWhileMoving(ctx context.Context, ring *v1alpha1.ControllerRing, lease *coordinationv1.Lease, now time.Time) (*coordinationv1.Lease, bool, error) {
	n, counted := c.opts.Registry.Assigned(ring.Name, lease.Name)
	switch {
	case !counted:
		return lease, true, nil
	case n == 0:
		return lease, false, nil
	}
	holder := ptr.Deref(lease.Spec.HolderIdentity, "")
	d := membership.DurationOf(lease)
	switch {
	case holder == c.opts.Identity:
		if now.Sub(membership.ReferenceTime(lease)) < d/3 {
			return lease, true, nil
		}
	case holder != "" && !strings.HasPrefix(holder, sharderIdentityPrefix):
		return lease, false, nil // taken by someone else: not the sharder's to hold
	}
	held := lease.DeepCopy()
	held.Spec.HolderIdentity = ptr.To(c.opts.Identity)
	held.Spec.RenewTime = ptr.To(metav1.NewMicroTime(now))
	if holder != c.opts.Identity {
		held.Spec.AcquireTime = ptr.To(metav1.NewMicroTime(now))
		held.Spec.LeaseTransitions = ptr.To(nextTransition(ptr.Deref(lease.Spec.LeaseTransitions, 0)))
	}
	if err := c.client.Update(ctx, held); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("holding Lease %s while its objects move: %w", klog.KObj(lease), err)
	}
	if holder == "" {
		ctrl.LoggerFrom(ctx).Info("Holding a released Lease while its objects move", "lease", klog.KObj(lease), "ring", ring.Name, "objects", n)
	}
	return held, true, nil
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

// nextTransition counts one more holder change, staying at the largest
// int32 instead of overflowing (the API server would reject the takeover
// forever).
func nextTransition(n int32) int32 {
	if n == math.MaxInt32 {
		return n
	}
	return n + 1
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
	list := &coordinationv1.LeaseList{}
	err := c.client.List(ctx, list, client.InNamespace(ring.Spec.LeaseNamespace), client.MatchingLabels{v1alpha1.LabelRing: name})
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("listing the Leases of ring %s: %w", name, err)
	}
	now := c.opts.Clock.Now()
	members, earliest := c.tracker.Members(name, list.Items, now)
	c.publish(ctx, name, members)
	if earliest.IsZero() {
		return reconcile.Result{}, nil
	}
	return reconcile.Result{RequeueAfter: earliest.Sub(now)}, nil
}

func (c *Controller) publish(ctx context.Context, ring string, members []membership.Member) {
	if c.opts.Registry.Set(ring, members) {
		ctrl.LoggerFrom(ctx).V(1).Info("Published ring membership", "ring", ring, "members", len(members))
	}
}
