package instance

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/instance/internal/inflight"
	"github.com/sharder-dev/sharder/pkg/instance/internal/slotcache"
	"github.com/sharder-dev/sharder/pkg/instance/leaseholder"
	"github.com/sharder-dev/sharder/pkg/slots"
)

// ErrSlotReleased is the cause (context.Cause) of the cancellation of a
// reconcile whose object's slot this instance let go of while it ran (slot
// mode: the sharder asked for the slot's release).
var ErrSlotReleased = errors.New("the object's slot was released by this instance")

// slotRun is a reconcile in flight of an object of a slot.
type slotRun struct {
	cancel context.CancelCauseFunc
	done   chan struct{}
}

// slotUnit is an instance's state in slot mode: its record of the slots it
// holds, which alone admits reconciles, and the reconciles in flight per
// slot.
type slotUnit struct {
	inst   *Instance
	cache  *slotcache.Cache
	client client.WithWatch // the ring's direct client
	log    logr.Logger

	// Set by start, before the gate opens.
	uid  types.UID
	spec *v1alpha1.ControllerRingSpec

	mu      sync.Mutex
	record  slots.Record
	dropped bool // the Lease was lost: the record is gone for good
	runs    map[int]map[uint64]*slotRun
	lastRun uint64
	// latest is the newest table the ring's watch delivered, not yet
	// applied when newer than the record.
	latest *slots.Table
	// gained are the slots the record gained since the cache last
	// followed it (followCache).
	gained map[int]bool

	// acked is the revision last acknowledged on the Lease by this
	// process; only the table loop touches it.
	acked int64

	tables    chan struct{} // a newer table arrived
	cacheWant chan struct{} // the cache should follow the record
	failed    chan error    // the ring changed under the instance
}

func newSlotUnit(i *Instance, sc *slotcache.Cache, c client.WithWatch) *slotUnit {
	return &slotUnit{
		inst:      i,
		cache:     sc,
		client:    c,
		log:       i.log.WithValues("mode", "Slots"),
		runs:      map[int]map[uint64]*slotRun{},
		gained:    map[int]bool{},
		tables:    make(chan struct{}, 1),
		cacheWant: make(chan struct{}, 1),
		failed:    make(chan error, 1),
	}
}

func kick(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// readRing reads the ring from the API server, never from a cache.
func (s *slotUnit) readRing(ctx context.Context) (*v1alpha1.ControllerRing, error) {
	return readRing(ctx, s.client, s.inst.opts.Ring)
}

// start is Instance.Start's part in slot mode once the Lease is held: it
// reads the ring directly, applies its table, then follows the ring until
// ctx ends. It calls open once the first table is applied. It returns an
// error when the ring does not fit the instance (ErrModeMismatch) or was
// replaced by another of the same name.
func (s *slotUnit) start(ctx context.Context, open func()) error {
	var ring *v1alpha1.ControllerRing
	for {
		var err error
		if ring, err = s.readRing(ctx); err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil //nolint:nilerr // a shutdown before the ring was read
		}
		s.log.Info("Could not read the ring; no reconciles until it is read", "error", err.Error())
		if !s.inst.sleep(ctx, s.inst.opts.RetryPeriod) {
			return nil
		}
	}
	if err := checkMode(ring, s.cache); err != nil {
		return err
	}
	s.uid, s.spec = ring.UID, ring.Spec.DeepCopy()
	s.offer(ring)

	go s.followCache(ctx)
	s.applyLatest(ctx)
	open()
	s.watchRing(ctx)
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-s.failed:
			return err
		case <-s.tables:
			s.applyLatest(ctx)
		}
	}
}

// offer takes ring's table as the latest when newer than the latest seen.
func (s *slotUnit) offer(ring *v1alpha1.ControllerRing) {
	if ring.UID != s.uid {
		select {
		case s.failed <- fmt.Errorf("ring %q was deleted and created again (UID %s, was %s): restart the instance to start from the new ring",
			ring.Name, ring.UID, s.uid):
		default:
		}
		return
	}
	t, err := slots.FromStatus(s.cache.Count(), ring.Status.Slots)
	if err != nil {
		s.log.Error(err, "Ignoring a slot table the sharder cannot have written", "revision", ring.Status.Slots.Revision)
		return
	}
	s.mu.Lock()
	if (s.latest != nil && t.Revision <= s.latest.Revision) || t.Revision <= s.record.Revision {
		s.mu.Unlock()
		return
	}
	s.latest = &t
	s.mu.Unlock()
	kick(s.tables)
}

// watchRing follows the ring (a watch of that one ControllerRing) until ctx
// ends, offering each version's table.
func (s *slotUnit) watchRing(ctx context.Context) {
	byName := fields.OneTermEqualSelector("metadata.name", s.inst.opts.Ring)
	listOptions := func(raw metav1.ListOptions) *client.ListOptions {
		return &client.ListOptions{FieldSelector: byName, Raw: &raw}
	}
	offer := func(obj any) {
		if r, ok := obj.(*v1alpha1.ControllerRing); ok {
			s.offer(r)
		}
	}
	_, informer := toolscache.NewInformerWithOptions(toolscache.InformerOptions{
		ListerWatcher: &toolscache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, raw metav1.ListOptions) (runtime.Object, error) {
				list := &v1alpha1.ControllerRingList{}
				return list, s.client.List(ctx, list, listOptions(raw))
			},
			WatchFuncWithContext: func(ctx context.Context, raw metav1.ListOptions) (watch.Interface, error) {
				return s.client.Watch(ctx, &v1alpha1.ControllerRingList{}, listOptions(raw))
			},
		},
		ObjectType: &v1alpha1.ControllerRing{},
		Handler: toolscache.ResourceEventHandlerFuncs{
			AddFunc:    offer,
			UpdateFunc: func(_, obj any) { offer(obj) },
		},
	})
	go informer.RunWithContext(ctx)
}

// applyLatest applies the latest table seen, if newer than the record:
// lost slots leave the record at once, their reconciles in flight are
// cancelled and waited for, then the table's releases are acknowledged on
// the Lease; gained slots join the record (admitted from now on). The cache
// follows the record on its own (followCache).
func (s *slotUnit) applyLatest(ctx context.Context) {
	s.mu.Lock()
	if s.latest == nil || s.dropped {
		s.mu.Unlock()
		return
	}
	t := *s.latest
	s.latest = nil
	next, gained, lost, ok := s.record.Apply(s.inst.opts.Identity, t)
	if !ok {
		s.mu.Unlock()
		return
	}
	s.record = next
	for _, slot := range gained {
		s.gained[slot] = true
	}
	var waits []*slotRun
	for _, slot := range lost {
		for _, r := range s.runs[slot] {
			waits = append(waits, r)
		}
	}
	s.mu.Unlock()

	if len(gained) > 0 || len(lost) > 0 {
		s.log.Info("Slot table applied", "revision", t.Revision, "gained", slots.FormatList(gained), "lost", slots.FormatList(lost),
			"holding", len(next.Slots), "reconcilesCancelled", len(waits))
	}
	for _, r := range waits {
		r.cancel(ErrSlotReleased)
	}
	if len(gained) > 0 {
		kick(s.cacheWant)
	}
	for _, r := range waits {
		select {
		case <-r.done:
		case <-ctx.Done():
			return
		}
	}
	_, releasing := t.HeldBy(s.inst.opts.Identity)
	if slices.ContainsFunc(releasing, func(slot int) bool { return t.Slots[slot].Since > s.acked }) {
		s.acknowledge(ctx, t.Revision)
	}
	if len(lost) > 0 {
		kick(s.cacheWant)
	}
}

// acknowledge writes the acknowledgement of revision on the Lease, a
// renewal brought forward, retrying until it landed, the Lease is no longer
// held or ctx ends.
func (s *slotUnit) acknowledge(ctx context.Context, revision int64) {
	value := slots.FormatAcknowledgement(s.uid, revision)
	for {
		err := s.inst.holder.Annotate(ctx, v1alpha1.AnnotationSlotsAcknowledged, value)
		switch {
		case err == nil:
			s.acked = revision
			s.log.Info("Acknowledged the slot table's releases on the Lease", "revision", revision)
			return
		case ctx.Err() != nil, errors.Is(err, leaseholder.ErrNotHeld), errors.Is(err, leaseholder.ErrLeaseLost):
			return
		}
		s.log.Info("Could not acknowledge the slot table's releases; retrying", "revision", revision, "error", err.Error())
		if !s.inst.sleep(ctx, s.inst.opts.RetryPeriod) {
			return
		}
	}
}

// Record returns a copy of the record.
func (s *slotUnit) Record() slots.Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slots.Record{Revision: s.record.Revision, Slots: slices.Clone(s.record.Slots)}
}

// drop forgets the record for good: the Lease is lost.
func (s *slotUnit) drop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dropped = true
	s.record = slots.Record{}
	s.latest = nil
}

// holds reports whether the record holds slot.
func (s *slotUnit) holds(slot int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.record.Holds(slot)
}

// begin admits a reconcile of an object of slot when the record holds it,
// registering cancel so that a release of the slot cancels it and waits for
// the returned end function.
func (s *slotUnit) begin(slot int, cancel context.CancelCauseFunc) (end func(), ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.record.Holds(slot) {
		return nil, false
	}
	s.lastRun++
	id := s.lastRun
	r := &slotRun{cancel: cancel, done: make(chan struct{})}
	if s.runs[slot] == nil {
		s.runs[slot] = map[uint64]*slotRun{}
	}
	s.runs[slot][id] = r
	return func() {
		s.mu.Lock()
		delete(s.runs[slot], id)
		if len(s.runs[slot]) == 0 {
			delete(s.runs, slot)
		}
		s.mu.Unlock()
		close(r.done)
	}, true
}

// slotOf returns the slot of obj, of kind gk: the slot its slot label
// names; while it has none, for a kind the cache selects by shard, its
// namespace's (slotcache.Cache.SlotOf). False when it has no slot.
func (s *slotUnit) slotOf(gk schema.GroupKind, obj metav1.Object) (int, bool) {
	return s.cache.SlotOf(gk, obj)
}

var _ unit = (*slotUnit)(nil)

// owns reports whether obj has a slot of the record.
func (s *slotUnit) owns(gk schema.GroupKind, obj metav1.Object) bool {
	slot, ok := s.slotOf(gk, obj)
	return ok && s.holds(slot)
}

// updated: objects of a slot let go of leave the slot cache silently. An
// object's slot label does not change but past the slot label policy; one
// that leaves the instance's slots so is moved.
func (s *slotUnit) updated(gvk schema.GroupVersionKind, oldObj, newObj client.Object) {
	if s.owns(gvk.GroupKind(), oldObj) && !s.owns(gvk.GroupKind(), newObj) {
		s.left(gvk, newObj, true)
	}
}

// left: there is no drain in slot mode: the object was deleted, or its slot
// label was changed past the slot label policy (not bound yet, or
// bypassed), which moves it to the holder of its new slot.
func (s *slotUnit) left(gvk schema.GroupVersionKind, obj client.Object, moved bool) {
	key := inflight.Key{GroupKind: gvk.GroupKind(), NamespacedName: client.ObjectKeyFromObject(obj)}
	s.inst.cancelMoved(gvk, key, moved)
	s.inst.notify(func(n Notifier) { n.OnLost(obj) })
}

// labelChild copies the owner's slot label; with ShardedListAndWatch, an
// owner of a kind selected by shard that is not labelled yet gives child
// the slot of its namespace, the slot the sharder will write on both.
func (s *slotUnit) labelChild(owner, child metav1.Object) bool {
	copied := LabelChild(s.inst.opts.Ring, owner, child)
	if _, ok := owner.GetLabels()[v1alpha1.SlotLabel(s.inst.opts.Ring)]; ok {
		return copied
	}
	ro, ok := owner.(runtime.Object)
	if !ok {
		return copied
	}
	gvk, err := apiutil.GVKForObject(ro, s.inst.mgr.GetScheme())
	if err != nil {
		return copied
	}
	slot, ok := s.slotOf(gvk.GroupKind(), owner)
	if !ok {
		return copied
	}
	labels := child.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels[v1alpha1.SlotLabel(s.inst.opts.Ring)] = strconv.Itoa(slot)
	child.SetLabels(labels)
	return true
}

// run reads the ring and applies its table before it opens the gate, then
// follows the ring (start).
func (s *slotUnit) run(ctx context.Context) error {
	go s.inst.checkWatchLag(ctx)
	return s.start(ctx, func() {
		s.inst.reconciles.Open()
		s.inst.log.Info("Instance holds its Lease and read its slots, reconciling", "slots", slots.FormatList(s.Record().Slots),
			"selectedByShard", s.cache.Sharded())
	})
}

func (s *slotUnit) lost() { s.drop() }

func (s *slotUnit) slotRecord() (slots.Record, bool) { return s.Record(), true }

// reconcile handles a request in slot mode: next runs only for an object
// whose slot label names a slot of the instance's record (or, not labelled
// yet and of a kind the cache selects by shard, whose namespace's slot is
// in the record), never by what the cache holds. An object absent from the cache that the API server no
// longer has is handed to next when the slot its name maps to (a main
// object's slot, slots.ForMainObject) is in the record, so that it can
// finish its deletion handling. A request dropped is not requeued: the
// slot's objects are the business of the instance it goes to.
func (s *slotUnit) reconcile(ctx context.Context, r *reconciler, req reconcile.Request, cancel context.CancelCauseFunc) (reconcile.Result, error) {
	log := logf.FromContext(ctx)
	obj, ok := r.proto.DeepCopyObject().(client.Object)
	if !ok {
		return reconcile.Result{}, reconcile.TerminalError(fmt.Errorf("%T is not a client.Object", r.proto))
	}
	var slot int
	if err := r.inst.client.Get(ctx, req.NamespacedName, obj); err != nil {
		if !apierrors.IsNotFound(err) {
			return reconcile.Result{}, fmt.Errorf("reading %s %s: %w", r.gvk.Kind, req.NamespacedName, err)
		}
		if _, err := r.readLive(ctx, req); !apierrors.IsNotFound(err) {
			if err != nil {
				return reconcile.Result{}, err
			}
			// It exists: of a slot not held, or of a slot just gained and
			// not yet in the cache (its arrival queues a request).
			log.V(1).Info("Request dropped: object not in this instance's cache")
			return reconcile.Result{}, nil
		}
		slot = slots.ForMainObject(s.spec, r.gvk.Group, r.gvk.Kind, req.Namespace, req.Name)
	} else {
		var known bool
		if slot, known = s.slotOf(r.gvk.GroupKind(), obj); !known {
			log.V(1).Info("Request dropped: object without a valid slot label")
			return reconcile.Result{}, nil
		}
	}
	end, admitted := s.begin(slot, cancel)
	if !admitted {
		log.V(1).Info("Request dropped: the object's slot is not held by this instance", "slot", slot)
		return reconcile.Result{}, nil
	}
	defer end()
	return r.next.Reconcile(ctx, req)
}
