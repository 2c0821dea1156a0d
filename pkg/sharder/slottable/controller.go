package slottable

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
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
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/sharder/eventrecorder"
	"github.com/sharder-dev/sharder/pkg/sharder/metrics"
	"github.com/sharder-dev/sharder/pkg/slots"
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
func NewController(opts Options) (*Controller, error) {
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
	c.mu.Lock()
	c.mu.Unlock()
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
			ctrl.LoggerFrom(ctx).Error(berr, "Writing the ring's slot label policy binding", "ring", ring.Name)
			if err == nil && !res.Requeue { //nolint:staticcheck // a rate-limited retry is retry enough
				if res.RequeueAfter == 0 || res.RequeueAfter > bindingRetry {
					res.RequeueAfter = bindingRetry
				}
			}
		}
	}
	return res, err
}

// decide runs slots.Step on the ring's table and writes the result.
func (c *Controller) decide(ctx context.Context, ring *v1alpha1.ControllerRing, st *ringState) (reconcile.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	count := ring.Spec.EffectiveSlotCount()
	table, err := slots.FromStatus(count, ring.Status.Slots)
	if err != nil {
		// Reported once per version of the ring: a change of the ring
		// (or someone correcting the table) decides again.
		if st.invalid != ring.ResourceVersion {
			st.invalid = ring.ResourceVersion
			log.Error(err, "The ring's slot table is not one the sharder writes; leaving it alone", "ring", ring.Name)
			c.recorder.Eventf(ring, corev1.EventTypeWarning, ReasonInvalidSlotTable, "The slot table in the ring's status is invalid, the sharder leaves it alone: %v", err)
		}
		return reconcile.Result{}, nil
	}
	leases := c.leases(ctx, ring)
	if res, stop, err := c.guardRevision(ctx, ring, table, leases, st); stop {
		return res, err
	}
	now := c.opts.Clock.Now()
	in, fenceEnds := c.input(ring, table, leases, st, now)
	res := slots.Step(table, in)
	next := earliest(res.Next, fenceEnds)
	if !res.Changed {
		c.setAssigned(ring.Name, table)
		if len(res.Fence) > 0 {
			requeue, err := c.fence(ctx, ring, leases, st, res.Fence)
			if err != nil || requeue {
				return reconcile.Result{Requeue: requeue}, err //nolint:staticcheck // a rate-limited retry
			}
		}
		return requeueAt(now, next), nil
	}

	// A slot of a gone instance is granted away only under the sharder's
	// hold of its Lease, and the hold is released only once the write that
	// grants it away returned: a permit per gone holder, around the write.
	var permits []func()
	defer func() {
		for _, done := range permits {
			done()
		}
	}()
	for _, id := range goneHolders(table, res.Actions) {
		done, ok := c.opts.Registry.BeginMove(ring.Name, id)
		if !ok {
			// Its hold ended since the members were read: decide again.
			log.V(1).Info("A gone instance is no longer movable; deciding the slot table again", "ring", ring.Name, "instance", id)
			c.setAssigned(ring.Name, table)
			return reconcile.Result{Requeue: true}, nil //nolint:staticcheck // a rate-limited retry
		}
		permits = append(permits, done)
	}

	updated := ring.DeepCopy()
	updated.Status.Slots = res.Table.Status()
	var patchOpts []client.SubResourcePatchOption
	if c.opts.FieldManager != "" {
		patchOpts = append(patchOpts, client.FieldOwner(c.opts.FieldManager))
	}
	if err := c.writer.Status().Patch(ctx, updated, client.MergeFromWithOptions(ring, client.MergeFromWithOptimisticLock{}), patchOpts...); err != nil {
		c.setAssigned(ring.Name, table)
		switch {
		case apierrors.IsConflict(err):
			// Someone wrote the ring since it was read (or the cache is
			// behind): decide again on the ring as it is.
			log.V(1).Info("The ring changed since its slot table was read; deciding again", "ring", ring.Name)
			return reconcile.Result{Requeue: true}, nil //nolint:staticcheck // a rate-limited retry
		case apierrors.IsNotFound(err):
			return reconcile.Result{}, nil
		case apierrors.IsForbidden(err) && len(permits) > 0:
			// The webhook denies a grant away from an instance that holds
			// its Lease again (it came back since the decision): decide
			// again once the members show it.
			log.Info("The slot table write was denied; deciding again", "ring", ring.Name, "reason", err.Error())
			return reconcile.Result{Requeue: true}, nil //nolint:staticcheck // a rate-limited retry
		}
		// Whatever the error, the write has landed or never will (the
		// API server enforced its deadline): the permits may end.
		return reconcile.Result{}, fmt.Errorf("writing the slot table of ring %s: %w", ring.Name, err)
	}
	written := c.opts.Clock.Now()
	st.revs.saw(updated.Status.Slots)
	if slices.Contains(res.Actions, slots.Release) {
		st.releasesSeen[res.Table.Revision] = written
	}
	c.setAssigned(ring.Name, res.Table)
	observeMoves(ring.Name, table, res.Actions, in.ReleasesSeen, written)
	log.Info("Wrote the slot table", "ring", ring.Name, "revision", res.Table.Revision, "actions", summary(res.Actions))
	if len(res.Fence) > 0 {
		// The write changed no slot of the instances to fence (Step
		// fences on slots it keeps releasing).
		requeue, err := c.fence(ctx, ring, leases, st, res.Fence)
		if err != nil || requeue {
			return reconcile.Result{Requeue: requeue}, err //nolint:staticcheck // a rate-limited retry
		}
	}
	return requeueAt(now, next), nil
}

// input is what Step decides from besides the table: the ring's members as
// the lease controller published them, with their acknowledgements, and
// the holders of slots that are no member. A fenced instance is movable
// only once its fence's wait is over; input also returns the earliest end
// of a wait still running (zero when none).
func (c *Controller) input(ring *v1alpha1.ControllerRing, table slots.Table, leases map[string]*coordinationv1.Lease, st *ringState, now time.Time) (slots.Input, time.Time) {
	st.observeFences(leases, now)
	weight := ring.Spec.EffectiveVirtualNodes()
	in := slots.Input{
		Instances:    map[string]slots.Instance{},
		ReleasesSeen: st.seen(table, now),
		DrainTimeout: ring.Spec.EffectiveDrainTimeout(),
		Now:          now,
	}
	var fenceEnds time.Time
	for _, m := range c.opts.Registry.Members(ring.Name) {
		inst := slots.Instance{State: m.State, Weight: m.Weight(weight), Movable: m.Movable}
		if lease := leases[m.ID]; lease != nil {
			inst.Acknowledged = slots.ParseAcknowledgement(lease.Annotations[v1alpha1.AnnotationSlotsAcknowledged], ring.UID)
		}
		if f, ok := st.fenced[m.ID]; ok && m.State.Gone() {
			if end := f.at.Add(f.wait); now.Before(end) {
				inst.Movable = false
				fenceEnds = earliest(fenceEnds, end)
			}
		}
		in.Instances[m.ID] = inst
	}
	for _, s := range table.Slots {
		if _, known := in.Instances[s.Holder]; known || s.Holder == "" {
			continue
		}
		// A holder that is no member (its Lease was deleted before this
		// sharder led, or the table names it by hand) may still be running:
		// held as vanished until the lease controller, which learns of it
		// from the slot counts (setAssigned), publishes it and holds it by
		// creating its Lease. An ID no Lease can have is gone.
		if membership.InvalidID(s.Holder) != nil {
			in.Instances[s.Holder] = slots.Instance{State: membership.StateDead, Movable: true}
		} else {
			in.Instances[s.Holder] = slots.Instance{State: membership.StateVanished}
		}
	}
	return in, fenceEnds
}

// leases returns the ring's instance Leases by name as the cache holds
// them: shared with the cache, never to be changed. An acknowledgement is a
// fact that stays true: a cache behind only delays a grant.
func (c *Controller) leases(ctx context.Context, ring *v1alpha1.ControllerRing) map[string]*coordinationv1.Lease {
	list := &coordinationv1.LeaseList{}
	if err := c.client.List(ctx, list, client.InNamespace(ring.Spec.LeaseNamespace),
		client.MatchingLabels{v1alpha1.LabelRing: ring.Name}, client.UnsafeDisableDeepCopy); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Listing the Leases of a ring; no acknowledgement counts", "ring", ring.Name)
		return nil
	}
	out := make(map[string]*coordinationv1.Lease, len(list.Items))
	for i := range list.Items {
		out[list.Items[i].Name] = &list.Items[i]
	}
	return out
}

// seen returns the times the releases of table were first seen, recording
// now for those seen for the first time and forgetting revisions no slot
// is releasing for any more.
func (st *ringState) seen(table slots.Table, now time.Time) map[int64]time.Time {
	live := map[int64]bool{}
	for _, s := range table.Slots {
		if s.Releasing {
			live[s.Since] = true
			if _, ok := st.releasesSeen[s.Since]; !ok {
				st.releasesSeen[s.Since] = now
			}
		}
	}
	maps.DeleteFunc(st.releasesSeen, func(rev int64, _ time.Time) bool { return !live[rev] })
	return maps.Clone(st.releasesSeen)
}

// goneHolders returns the holders whose slots Step grants away as gone,
// sorted.
func goneHolders(table slots.Table, actions []slots.Action) []string {
	var ids []string
	for i, a := range actions {
		if a == slots.GrantGone && !slices.Contains(ids, table.Slots[i].Holder) {
			ids = append(ids, table.Slots[i].Holder)
		}
	}
	slices.Sort(ids)
	return ids
}

// setAssigned tells the lease controller how many slots each instance holds
// in table (it holds a dead instance's Lease while it holds any) and
// publishes the counts as sharder_ring_slots.
func (c *Controller) setAssigned(ring string, table slots.Table) {
	held := counts(table)
	c.opts.Registry.SetAssigned(ring, held)
	metrics.Slots.DeletePartialMatch(map[string]string{metrics.LabelRing: ring})
	for id, n := range held {
		metrics.Slots.WithLabelValues(ring, id).Set(float64(n))
	}
}

// observeMoves counts the slots a table write granted to another instance,
// by reason, and the time from each acknowledged release's write to the
// grant: table is the table decided on, releasesSeen when each of its
// releases was seen written, written when the grant's write returned.
func observeMoves(ring string, table slots.Table, actions []slots.Action, releasesSeen map[int64]time.Time, written time.Time) {
	for i, a := range actions {
		switch a {
		case slots.GrantAcknowledged:
			metrics.SlotMovesTotal.WithLabelValues(ring, metrics.SlotMoveRelease).Inc()
			if seen, ok := releasesSeen[table.Slots[i].Since]; ok {
				metrics.SlotReleaseDuration.WithLabelValues(ring).Observe(written.Sub(seen).Seconds())
			}
		case slots.GrantGone:
			metrics.SlotMovesTotal.WithLabelValues(ring, metrics.SlotMoveGone).Inc()
		}
	}
}

// counts returns how many slots each instance holds in table, granted and
// releasing: the lease controller holds a dead instance's Lease while it
// holds any.
func counts(table slots.Table) map[string]int32 {
	out := map[string]int32{}
	for _, s := range table.Slots {
		if s.Holder != "" {
			out[s.Holder]++
		}
	}
	return out
}

// summary counts actions other than keep and hold, for the log.
func summary(actions []slots.Action) map[string]int {
	out := map[string]int{}
	for _, a := range actions {
		if a != slots.Keep && a != slots.Hold {
			out[a.String()]++
		}
	}
	return out
}

// earliest returns the earlier of two times, zero meaning none.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

// requeueAt returns the result that requeues at next, if any.
func requeueAt(now, next time.Time) reconcile.Result {
	if next.IsZero() {
		return reconcile.Result{}
	}
	return reconcile.Result{RequeueAfter: max(next.Sub(now), time.Millisecond)}
}
