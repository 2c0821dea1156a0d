package slottable

import (
	"context"
	"fmt"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
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

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/sharder/eventrecorder"
	"github.com/sharder-dev/sharder/pkg/sharder/metrics"
)

// Event reasons of the controller, on the ring.
const (
	// ReasonInvalidSlotTable: the ring's status.slots is not a table the
	// sharder writes; the controller leaves it alone.
	ReasonInvalidSlotTable = "InvalidSlotTable"
	// ReasonFenced: a ready instance did not acknowledge a release within
	// the ring's drainTimeout; the sharder took its Lease, and grants its
	// slots to others one lease duration of the instance later.
	ReasonFenced = "InstanceFenced"
)

// bindingRetry is how soon a ring whose policy binding could not be written
// is looked at again.
const bindingRetry = 10 * time.Second

// Controller is the sharder's slot table controller (docs/design.md §11).
// It runs on the elected sharder only, next to the lease controller whose
// Registry it reads. One work item per ring of unit Slots, woken by the
// ring, by the Registry's membership changes and by a change of an
// acknowledgement on the ring's Leases; each reconcile:
//
//   - reads the ring's table (status.slots; a new ring's is
//     slots.NewTable), its members from the Registry with their weights,
//     and the acknowledgements on their Leases (the cache's);
//   - decides on no table that went back (revision.go): below a revision
//     it wrote, its cache showed or an instance acknowledged, or of the
//     newest revision with other content. It writes the newest table it saw
//     back above every revision seen, or, not knowing that table, leaves
//     the ring alone; either way it reports the ring;
//   - runs slots.Step, and writes the next table when it changed, locked on
//     the ring's resourceVersion (a conflict re-reads and decides again),
//     with Options.WriteTimeout;
//   - records each instance's slot count in the Registry (SetAssigned), so
//     that the lease controller holds a dead instance's Lease while it
//     holds slots, and takes a Registry.BeginMove permit per gone holder
//     around a write granting its slots away, so that the hold ends only
//     after that write returned;
//   - fences a ready instance that did not acknowledge a release within
//     the ring's drainTimeout (fence.go), and grants its slots one lease
//     duration after the takeover;
//   - requeues the ring when a release's drain timeout, a fence's wait or
//     the hold of unknown holders ends;
//   - creates or updates the ring's binding of the slot label policy
//     (slotpolicy.Binding), once per generation of the ring.
//
// It needs, besides the lease controller's permissions: update and patch on
// controllerrings/status; get, create and update on
// admissionregistration.k8s.io validatingadmissionpolicybindings (unless
// Options.SkipBinding).
type Controller struct {
	opts   Options
	client client.Client
	// writer writes the tables, with Options.WriteTimeout.
	writer   client.Client
	reader   client.Reader
	recorder record.EventRecorder

	mu    sync.Mutex
	rings map[string]*ringState
}

// ringState is what the controller remembers of a ring between reconciles.
type ringState struct {
	uid types.UID
	// releasesSeen is when this process first saw each revision that asked
	// for releases (slots.Input.ReleasesSeen).
	releasesSeen map[int64]time.Time
	// revs are the table revisions seen: the ring's table never goes back
	// (revision.go).
	revs revisions
	// fenced are the instances whose Lease carries the fence (taken by
	// this process, or first seen fenced): their slots are movable only
	// once the fence's wait is over.
	fenced map[string]fence
	// binding is the generation of the ring whose policy binding was
	// written; 0 before.
	binding int64
	// invalid is the resourceVersion of the ring last reported as carrying
	// an invalid table.
	invalid string
}

// NewController returns a slot table controller for opts, with defaults
// filled in. It fails when a field is invalid, naming the field.
func New(opts Options) (*Controller, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	return &Controller{opts: opts, rings: map[string]*ringState{}}, nil
}

// SetupWithManager adds the controller to mgr. The manager's cache should
// hold the instance Leases (leasecontroller.CacheByObject) and the rings,
// and its scheme the sharder.dev types. The lease controller writing
// Options.Registry runs in the same manager.
func (c *Controller) SetupWithManager(mgr ctrl.Manager) error {
	c.client = mgr.GetClient()
	c.reader = mgr.GetAPIReader()
	// The table writes carry a deadline the API server enforces (client-go
	// sends the client's timeout as the request's timeout parameter).
	writeCfg := rest.CopyConfig(mgr.GetConfig())
	writeCfg.Timeout = c.opts.WriteTimeout
	writer, err := client.New(writeCfg, client.Options{Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper()})
	if err != nil {
		return fmt.Errorf("creating the slot table writer: %w", err)
	}
	c.writer = writer
	c.recorder = c.opts.EventRecorder
	if c.recorder == nil {
		rec, err := eventrecorder.New(mgr, "sharder")
		if err != nil {
			return err
		}
		c.recorder = rec
	}
	slotRings := predicate.NewPredicateFuncs(func(obj client.Object) bool {
		ring, ok := obj.(*v1alpha1.ControllerRing)
		return !ok || ring.Spec.AssignsSlots()
	})
	err = ctrl.NewControllerManagedBy(mgr).
		Named("slottable").
		For(&v1alpha1.ControllerRing{}, builder.WithPredicates(slotRings)).
		Watches(&coordinationv1.Lease{}, handler.EnqueueRequestsFromMapFunc(ringOfLease), builder.WithPredicates(acknowledgementChanged())).
		WatchesRawSource(source.Func(c.subscribe)).
		WithOptions(controller.Options{
			MaxConcurrentReconciles: c.opts.Workers,
			// The priority queue reads the real clock; client-go's queue
			// waits on Options.Clock, as the decisions' Now.
			UsePriorityQueue: ptr.To(false),
			NewQueue: func(name string, limiter workqueue.TypedRateLimiter[reconcile.Request]) workqueue.TypedRateLimitingInterface[reconcile.Request] {
				return workqueue.NewTypedRateLimitingQueueWithConfig(limiter, workqueue.TypedRateLimitingQueueConfig[reconcile.Request]{
					Name:  name,
					Clock: c.opts.Clock,
				})
			},
		}).
		Complete(reconcile.Func(c.reconcile))
	if err != nil {
		return fmt.Errorf("adding controller %q: %w", "slottable", err)
	}
	return nil
}

// subscribe is the source of membership changes: the Registry wakes the
// ring whose members changed. It runs when the controller starts, which
// starts the hold of unknown holders.
func (c *Controller) subscribe(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
	c.opts.Registry.Subscribe(func(ring string) {
		q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Name: ring}})
	})
	return nil
}

// ringOfLease maps an instance Lease to its ring.
func ringOfLease(_ context.Context, lease client.Object) []reconcile.Request {
	ring := lease.GetLabels()[v1alpha1.LabelRing]
	if ring == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: ring}}}
}

// acknowledgementChanged passes the Lease events that can change a
// decision besides the membership, which the Registry reports: a new or
// deleted Lease, and a change of its acknowledgement. Renewals pass not.
func acknowledgementChanged() predicate.Funcs {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		return e.ObjectOld.GetAnnotations()[v1alpha1.AnnotationSlotsAcknowledged] != e.ObjectNew.GetAnnotations()[v1alpha1.AnnotationSlotsAcknowledged] ||
			e.ObjectOld.GetLabels()[v1alpha1.LabelRing] != e.ObjectNew.GetLabels()[v1alpha1.LabelRing]
	}}
}

// state returns the controller's memory of ring, new when the ring is new
// (or was created again with the same name).
func (c *Controller) state(ring *v1alpha1.ControllerRing) *ringState {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.rings[ring.Name]
	if st == nil || st.uid != ring.UID {
		st = &ringState{uid: ring.UID, releasesSeen: map[int64]time.Time{}, fenced: map[string]fence{}}
		c.rings[ring.Name] = st
	}
	return st
}

// forget drops what the controller remembers of a ring.
func (c *Controller) forget(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.rings, name)
}

// reconcile decides one ring's slot table and writes its policy binding.
func (c *Controller) reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	ring := &v1alpha1.ControllerRing{}
	if err := c.client.Get(ctx, req.NamespacedName, ring); err != nil {
		if apierrors.IsNotFound(err) {
			c.forget(req.Name)
			c.opts.Registry.SetAssigned(req.Name, nil)
			metrics.Slots.DeletePartialMatch(map[string]string{metrics.LabelRing: req.Name})
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, fmt.Errorf("getting ring %s: %w", req.Name, err)
	}
	if !ring.Spec.AssignsSlots() {
		// Not a slot ring (a Registry change of an object ring): its
		// object counts are the assignment's.
		return reconcile.Result{}, nil
	}
	if !ring.DeletionTimestamp.IsZero() {
		// Being deleted: its labels are removed, its table decides nothing.
		return reconcile.Result{}, nil
	}
	st := c.state(ring)
	// The slot label policy is bound before the table is decided: by the
	// time a first table grants a slot, changes of slot labels are refused.
	var berr error
	if !c.opts.SkipBinding {
		berr = c.writeBinding(ctx, ring, st)
	}
	res, err := c.decide(ctx, ring, st)
	if !c.opts.SkipBinding {
		if berr != nil {
			// Retried on its own schedule: as an error it would replace the
			// table's requeue (a drain deadline, a fence's wait) by a
			// growing backoff.
			logf.FromContext(ctx).Error(berr, "Writing the ring's slot label policy binding", "ring", ring.Name)
			if err == nil && !res.Requeue { //nolint:staticcheck // a rate-limited retry is retry enough
				if res.RequeueAfter == 0 || res.RequeueAfter > bindingRetry {
					res.RequeueAfter = bindingRetry
				}
			}
		}
	}
	return res, err
}
