package leasecontroller

import (
	"context"
	"fmt"
	"sync"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/go-logr/logr"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/sharder/eventrecorder"
	"github.com/sharder-dev/sharder/pkg/sharder/metrics"
)

// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=sharder.dev,resources=controllerrings,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

// Controller is the sharder's lease controller. It runs on the elected
// sharder only. For every instance Lease of a ring (labelled
// sharder.dev/ring=<ring> in the ring's spec.leaseNamespace) it:
//
//   - writes the state into the sharder.dev/state label, only when it changes
//     and only against the resourceVersion it computed the state from;
//   - takes an uncertain Lease once (holder = Identity, duration twice the
//     Lease's), proving that the API server is reachable and the instance
//     is gone; the Lease is then dead;
//   - holds the Lease of a dead instance while its objects move, and
//     releases it when they cannot or need not; it creates, to hold it,
//     the Lease of an instance whose Lease is absent (deleted, or never
//     seen) and takes one somebody else holds once it went unrenewed for
//     its duration: objects move only under the sharder's hold;
//   - deletes an orphaned Lease, preconditioned on its resourceVersion;
//   - requeues the Lease at its next transition, so a state changes when
//     its time comes (on Options.Clock), not at the next resync;
//   - publishes each ring's members with their states into the Registry
//     whenever they change, including when a ring's leaseNamespace changes or
//     the ring is deleted (its membership then becomes empty).
//
// Leases outside their ring's leaseNamespace, and Leases of rings that do
// not exist, are not members: the controller writes nothing to them except
// removing a sharder.dev/state label it may have written before.
//
// It is two controller-runtime controllers sharing one tracker: "lease"
// reconciles Leases (this file, takeover.go, hold.go, state.go) and
// "membership" reconciles rings and publishes their members (ring.go).
type Controller struct {
	opts   Options
	client client.Client
	// reader reads from the API server, not the cache: Leases outside
	// every ring, which the cache does not hold.
	reader   client.Reader
	recorder record.EventRecorder

	// tracker computes states from the Leases as this sharder observed them,
	// and remembers instances whose Lease vanished.
	tracker membership.Tracker

	// reported holds, per Lease, the malformed virtual-nodes value last
	// reported in an event, so that each value is reported once.
	reported sync.Map
	// reportedLag holds, per Lease, the malformed max-watch-lag value last
	// reported in an event.
	reportedLag sync.Map
	// reportedStop holds, per Lease, the malformed max-stop value last
	// reported in an event.
	reportedStop sync.Map
	// invalid holds the Leases reported as having an invalid instance ID.
	invalid sync.Map

	// woken carries Leases to reconcile besides their own changes: dead
	// instances whose objects can move once a ring has a ready instance.
	woken chan event.TypedGenericEvent[*coordinationv1.Lease]
	// ringsWoken carries rings whose membership to publish again besides
	// their Leases' changes: objects counted on an instance that is no
	// member, or whose Lease the sharder does not hold (absent.go).
	ringsWoken chan event.TypedGenericEvent[*v1alpha1.ControllerRing]
	// logger is the manager's, named after the lease controller, for
	// what happens outside a reconcile.
	logger logr.Logger
}

// NewController returns a lease controller for opts, with defaults filled
// in. It fails when a field is invalid, naming the field.
func New(opts Options) (*Controller, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	c := &Controller{
		opts:       opts,
		woken:      make(chan event.TypedGenericEvent[*coordinationv1.Lease], 1024),
		ringsWoken: make(chan event.TypedGenericEvent[*v1alpha1.ControllerRing], 1024),
	}
	c.tracker.WriteTimeout = opts.WriteTimeout
	return c, nil
}

// SetupWithManager adds the controller to mgr. The manager's cache should be
// built with CacheByObject, and its scheme must hold the sharder.dev types.
func (c *Controller) SetupWithManager(mgr ctrl.Manager) error {
	c.client = mgr.GetClient()
	c.reader = mgr.GetAPIReader()
	c.logger = mgr.GetLogger().WithName("lease")
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
		For(&coordinationv1.Lease{}, builder.WithPredicates(predicate.Funcs{UpdateFunc: c.needsReconcile})).
		Watches(&v1alpha1.ControllerRing{}, c.ringEvents()).
		WatchesRawSource(source.Channel(c.woken, &handler.TypedEnqueueRequestForObject[*coordinationv1.Lease]{})).
		WithOptions(c.controllerOptions(c.opts.Workers)).
		Complete(reconcile.Func(c.reconcileLease))
	if err != nil {
		return fmt.Errorf("adding controller %q: %w", "lease", err)
	}
	err = ctrl.NewControllerManagedBy(mgr).
		Named("membership").
		// A write of the ring's status alone changes no membership.
		For(&v1alpha1.ControllerRing{}, builder.WithPredicates(predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
			old, okOld := e.ObjectOld.(*v1alpha1.ControllerRing)
			ring, ok := e.ObjectNew.(*v1alpha1.ControllerRing)
			return !ok || !okOld || specChanged(old, ring)
		}})).
		Watches(&coordinationv1.Lease{}, c.leaseEvents()).
		WatchesRawSource(source.Channel(c.ringsWoken, &handler.TypedEnqueueRequestForObject[*v1alpha1.ControllerRing]{})).
		WithOptions(c.controllerOptions(0)). // the manager's default number of workers
		Complete(reconcile.Func(c.reconcileRing))
	if err != nil {
		return fmt.Errorf("adding controller %q: %w", "membership", err)
	}
	c.opts.Registry.SubscribeStranded(c.wakeRing)
	return nil
}

// needsReconcile reports whether an update of a Lease needs a reconcile. A
// renewal of a ready member's Lease whose state label says ready does not:
// it is recorded here, when it arrives, which is when the sharder observes
// it, and the reconcile already queued for the Lease's expiry reads the new
// renewal then and queues itself again for the new expiry. So a ring's
// steady renewals cost the sharder one watch event each, not a reconcile
// (a thousand instances renew 200 times a second).
func (c *Controller) needsReconcile(e event.UpdateEvent) bool {
	old, okOld := e.ObjectOld.(*coordinationv1.Lease)
	lease, ok := e.ObjectNew.(*coordinationv1.Lease)
	if !ok || !okOld || !renewalOnly(old, lease) || lease.Labels[v1alpha1.LabelState] != string(membership.StateReady) {
		return true
	}
	return !c.tracker.Renewed(lease.Labels[v1alpha1.LabelRing], lease, c.opts.Clock.Now())
}

// controllerOptions returns the options of one of the two controllers: its
// work queue waits on Options.Clock, so that a RequeueAfter (a
// Lease's next transition) and a retry's backoff follow the clock the states
// are computed with. controller-runtime's priority queue always reads the
// real clock, so the controllers use client-go's rate-limiting queue.
func (c *Controller) controllerOptions(workers int) controller.Options {
	return controller.Options{
		MaxConcurrentReconciles: workers,
		UsePriorityQueue:        ptr.To(false),
		NewQueue: func(name string, limiter workqueue.TypedRateLimiter[reconcile.Request]) workqueue.TypedRateLimitingInterface[reconcile.Request] {
			return workqueue.NewTypedRateLimitingQueueWithConfig(limiter, workqueue.TypedRateLimitingQueueConfig[reconcile.Request]{
				Name:  name,
				Clock: c.opts.Clock,
			})
		},
	}
}

// reconcileLease brings one Lease's state label, takeover, hold and
// deletion up to date and requeues it at its next transition.
func (c *Controller) reconcileLease(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	log := logf.FromContext(ctx)
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
	c.reportMaxWatchLag(ctx, ring, lease)
	c.reportMaxStop(ctx, ring, lease)

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
		log.Info("Took the Lease of an instance that stopped renewing: it is dead", "object", klog.KObj(lease), "ring", ring.Name)
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
