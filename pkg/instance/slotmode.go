package instance

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/instance/leaseholder"
	"github.com/sharder-dev/sharder/pkg/instance/slotcache"
	"github.com/sharder-dev/sharder/pkg/slots"
)

// ErrSlotReleased is the cause (context.Cause) of the cancellation of a
// reconcile whose object's slot this instance let go of while it ran (slot
// mode: the sharder asked for the slot's release).
var ErrSlotReleased = errors.New("the object's slot was released by this instance")

// ErrModeMismatch is wrapped by the errors of Setup, of the cache SlotCache
// returns and of Instance.Start that refuse a manager whose cache does not
// fit the ring's unit: a ring of unit Slots with a cache that is not a slot
// cache, or a slot cache for a ring of unit Objects or of another slot
// count.
var ErrModeMismatch = errors.New("the manager's cache does not fit the ring's assignment unit")

// ringReadTimeout bounds each read of the ring.
const ringReadTimeout = 10 * time.Second

// cacheSwitchTimeout bounds one switch of the cache to the record's slots
// (the new group caches' sync): a switch that cannot sync is tried again
// with the record as it is then, rather than hold up the switches that
// follow.
const cacheSwitchTimeout = time.Minute

// SlotCache returns the manager.Options.NewCache of an instance of a ring
// of unit Slots (docs/design.md §11): it reads the ring from the API server
// when the manager is created, and creates a slotcache.Cache of the ring's
// slot count for the ring's resources objects (one empty object of each of
// the ring's main and controlled resources the instance reads or watches,
// e.g. &corev1.ConfigMap{}), with the manager's cache options. Setup finds
// it and runs the instance in slot mode:
//
//	mgr, _ := ctrl.NewManager(cfg, ctrl.Options{NewCache: instance.SlotCache("my-ring", &corev1.ConfigMap{})})
//	inst, _ := instance.Setup(mgr, instance.Options{Ring: "my-ring", LeaseNamespace: "my-system"})
//
// Creating the manager fails when the ring does not exist, cannot be read,
// or is not of unit Slots (ErrModeMismatch). slotcache.NewCacheFunc with the
// ring's count does the same without reading the ring then; the instance
// checks the count when it starts.
func SlotCache(ring string, objects ...client.Object) cache.NewCacheFunc {
	return SlotCacheWith(ring, SlotOptions{}, objects...)
}

// SlotOptions configures the slot cache of SlotCacheWith.
type SlotOptions struct {
	// ShardedListAndWatch makes the instance watch its slots with the API
	// server's shard selector on the namespace instead of the slot label
	// (docs/design.md §11, "Sharded list and watch"): each watch group's
	// watch of a resource carries shardSelector =
	// shardRange(object.metadata.namespace, start, end) || ..., one range
	// per run of consecutive slots. The instance then receives, and
	// reconciles, an object of its slots as soon as it is created, before
	// the sharder wrote its slot label (a main object of a ring of key
	// Namespace has the slot of its namespace, whether labelled yet or not).
	//
	// It needs a ring of unit Slots whose slots are keyed by namespace
	// (spec.assignment.slots.key: Namespace): creating the manager fails
	// otherwise. It applies to the ring's main resources among the cache's
	// objects, and to its controlled resources when every main resource is
	// namespaced (the children of a namespaced object are in its
	// namespace); the controlled resources of a ring with a cluster-scoped
	// main resource, and objects of resources that are not the ring's, keep
	// the slot label selector. Note that a controlled resource selected by
	// shard brings every object of that resource in the instance's
	// namespaces into its cache, those that no object of the ring controls
	// too (they cause no reconcile).
	//
	// The shard selector is filtered by Kubernetes 1.36 and later with the
	// ShardedListAndWatch feature gate (kube-apiserver
	// --feature-gates=ShardedListAndWatch=true). A server without the gate
	// ignores it silently and returns every object: the instance still
	// holds and reconciles only its slots' objects, since it checks every
	// object's slot itself (its slot label, else its namespace's), but
	// each of its watch groups (up to 64 per resource) receives all objects
	// of the resources, far more than with the label selector; it logs that
	// once (slotcache.Cache.ShardStats counts them). Turn it on only where
	// the API server has the gate.
	// The same holds for a 1.36 server's watches served without its watch
	// cache (--watch-cache=false), which it does not filter.
	//
	// An object whose slot label contradicts its namespace (set wrongly at
	// creation: the ring's policy cannot compute the hash) has the slot its
	// label names, as for an instance without this option, so that
	// instances with and without it never disagree on an object's slot;
	// but a watch by shard receives it by its namespace's slot and keeps it
	// only if its label's slot is among the watch's, so an instance
	// selecting by shard may never see it. The sharder reports such
	// objects.
	//
	// Default: false, the slot label selects every resource.
	ShardedListAndWatch bool
}

// SlotCacheWith is SlotCache with options: see SlotOptions.
//
//	mgr, _ := ctrl.NewManager(cfg, ctrl.Options{NewCache: instance.SlotCacheWith("my-ring",
//		instance.SlotOptions{ShardedListAndWatch: true}, &corev1.ConfigMap{})})
func SlotCacheWith(ring string, slotOpts SlotOptions, objects ...client.Object) cache.NewCacheFunc {
	return func(cfg *rest.Config, opts cache.Options) (cache.Cache, error) {
		c, err := newRingClient(cfg, opts.HTTPClient)
		if err != nil {
			return nil, fmt.Errorf("slot cache of ring %q: %w", ring, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), ringReadTimeout)
		defer cancel()
		r := &v1alpha1.ControllerRing{}
		if err := c.Get(ctx, client.ObjectKey{Name: ring}, r); err != nil {
			return nil, fmt.Errorf("slot cache of ring %q: reading the ring: %w", ring, err)
		}
		if !r.Spec.AssignsSlots() {
			return nil, fmt.Errorf("slot cache of ring %q: %w: the ring assigns %s, not Slots; create the manager with Cache: instance.CacheOptions(...)",
				ring, ErrModeMismatch, unitOf(&r.Spec))
		}
		var sharded []client.Object
		if slotOpts.ShardedListAndWatch {
			if key := r.Spec.EffectiveSlotKey(); key != v1alpha1.SlotKeyNamespace {
				return nil, fmt.Errorf("slot cache of ring %q: %w", ring, errShardedKey(ring, key))
			}
			if sharded, err = shardedObjects(cfg, opts, &r.Spec, objects); err != nil {
				return nil, fmt.Errorf("slot cache of ring %q: %w", ring, err)
			}
		}
		return slotcache.New(cfg, slotcache.Options{Ring: ring, Count: r.Spec.EffectiveSlotCount(), Objects: objects, Cache: opts, Sharded: sharded})
	}
}

// ErrShardedListAndWatch is wrapped by the errors that refuse a slot cache
// selecting by shard (SlotOptions.ShardedListAndWatch) for a ring whose
// slots are not keyed by namespace: when the manager is created, at Setup
// or at start.
var ErrShardedListAndWatch = errors.New("sharded list and watch needs a ring whose slots are keyed by namespace")

func errShardedKey(ring, key string) error {
	return fmt.Errorf("%w: ring %q has spec.assignment.slots.key %s, whose slots are not ranges of the namespace's hash; "+
		"create the ring with spec.assignment.slots.key: Namespace (fixed at creation), or turn ShardedListAndWatch off",
		ErrShardedListAndWatch, ring, key)
}

// shardedObjects returns the objects whose resources an instance selects by
// shard on a ring of key Namespace: the ring's main and controlled
// resources when every main resource is namespaced (as the API server's
// discovery says; a main resource it does not know counts as
// cluster-scoped), its main resources alone when it has no controlled
// ones, and none otherwise: the children of a cluster-scoped controller
// carry its slot by label only, so a main object watched by shard could be
// seen before its children, which are seen only once labelled.
func shardedObjects(cfg *rest.Config, opts cache.Options, spec *v1alpha1.ControllerRingSpec, objects []client.Object) ([]client.Object, error) {
	scheme, mapper := opts.Scheme, opts.Mapper
	if scheme == nil {
		scheme = clientgoscheme.Scheme
	}
	if mapper == nil {
		hc := opts.HTTPClient
		if hc == nil {
			var err error
			if hc, err = rest.HTTPClientFor(cfg); err != nil {
				return nil, fmt.Errorf("HTTP client: %w", err)
			}
		}
		var err error
		if mapper, err = apiutil.NewDynamicRESTMapper(cfg, hc); err != nil {
			return nil, fmt.Errorf("REST mapper: %w", err)
		}
	}
	mainsNamespaced := true
	for _, r := range spec.Resources {
		gvk, err := mapper.KindFor(schema.GroupVersionResource{Group: r.Group, Resource: r.Resource})
		if err != nil {
			mainsNamespaced = false
			break
		}
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil || m.Scope.Name() != apimeta.RESTScopeNameNamespace {
			mainsNamespaced = false
			break
		}
	}
	var out []client.Object
	for _, obj := range objects {
		gvk, err := apiutil.GVKForObject(obj, scheme)
		if err != nil {
			return nil, fmt.Errorf("ring resource %T: %w", obj, err)
		}
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return nil, fmt.Errorf("ring resource %s: %w", gvk.GroupKind(), err)
		}
		gr := m.Resource.GroupResource()
		if (spec.IsMainResource(gr) && (mainsNamespaced || len(spec.ControlledResources()) == 0)) ||
			(mainsNamespaced && slices.Contains(spec.ControlledResources(), gr)) {
			out = append(out, obj)
		}
	}
	return out, nil
}

// ringScheme knows the ControllerRing alone: the instance reads its ring
// whatever the manager's scheme holds.
var ringScheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}()

// newRingClient returns a direct client (no cache) for ControllerRings.
func newRingClient(cfg *rest.Config, hc *http.Client) (client.WithWatch, error) {
	c, err := client.NewWithWatch(cfg, client.Options{HTTPClient: hc, Scheme: ringScheme})
	if err != nil {
		return nil, fmt.Errorf("creating the ring's client: %w", err)
	}
	return c, nil
}

func unitOf(spec *v1alpha1.ControllerRingSpec) string {
	if spec.Assignment == nil || spec.Assignment.Unit == "" {
		return v1alpha1.AssignmentUnitObjects
	}
	return spec.Assignment.Unit
}

// checkMode returns an error wrapping ErrModeMismatch when ring's unit does
// not fit the manager's cache: sc is the slot cache, nil for another cache.
func checkMode(ring *v1alpha1.ControllerRing, sc *slotcache.Cache) error {
	switch slotsRing := ring.Spec.AssignsSlots(); {
	case slotsRing && sc == nil:
		return fmt.Errorf("%w: ring %q assigns Slots, but the manager's cache is not a slot cache: create the manager with NewCache: instance.SlotCache(%q, <the ring's resources>...)",
			ErrModeMismatch, ring.Name, ring.Name)
	case !slotsRing && sc != nil:
		return fmt.Errorf("%w: ring %q assigns %s, but the manager's cache is a slot cache: create the manager with Cache: instance.CacheOptions(...)",
			ErrModeMismatch, ring.Name, unitOf(&ring.Spec))
	case slotsRing && sc.Count() != ring.Spec.EffectiveSlotCount():
		return fmt.Errorf("%w: ring %q has %d slots, but the manager's slot cache was created for %d",
			ErrModeMismatch, ring.Name, ring.Spec.EffectiveSlotCount(), sc.Count())
	case slotsRing && len(sc.Sharded()) > 0 && ring.Spec.EffectiveSlotKey() != v1alpha1.SlotKeyNamespace:
		return errShardedKey(ring.Name, ring.Spec.EffectiveSlotKey())
	}
	return nil
}

// slotRun is a reconcile in flight of an object of a slot.
type slotRun struct {
	cancel context.CancelCauseFunc
	done   chan struct{}
}

// slotMode is an instance's state in slot mode: its record of the slots it
// holds, which alone admits reconciles, and the reconciles in flight per
// slot.
type slotMode struct {
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

func newSlotMode(i *Instance, sc *slotcache.Cache, c client.WithWatch) *slotMode {
	return &slotMode{
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
func (s *slotMode) readRing(ctx context.Context) (*v1alpha1.ControllerRing, error) {
	ctx, cancel := context.WithTimeout(ctx, ringReadTimeout)
	defer cancel()
	r := &v1alpha1.ControllerRing{}
	if err := s.client.Get(ctx, client.ObjectKey{Name: s.inst.opts.Ring}, r); err != nil {
		return nil, err
	}
	return r, nil
}

// start is Instance.Start's part in slot mode once the Lease is held: it
// reads the ring directly, applies its table, then follows the ring until
// ctx ends. It calls open once the first table is applied. It returns an
// error when the ring does not fit the instance (ErrModeMismatch) or was
// replaced by another of the same name.
func (s *slotMode) start(ctx context.Context, open func()) error {
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
func (s *slotMode) offer(ring *v1alpha1.ControllerRing) {
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
func (s *slotMode) watchRing(ctx context.Context) {
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
func (s *slotMode) applyLatest(ctx context.Context) {
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
func (s *slotMode) acknowledge(ctx context.Context, revision int64) {
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

// followCache makes the cache watch the record's slots whenever asked,
// until ctx ends. The record, not the cache, admits reconciles: the cache
// may be behind the record for as long as a switch takes.
//
// A released slot whose watch group keeps other slots lingers in the cache
// for Options.SlotCacheLinger (lingering), so that the list that narrows
// the group comes after the hand-over rather than during it; a group that
// gains a slot is listed anew anyway, and without its released slots.
//
// A slot the record let go of and gained again before the cache let go of
// it (a release withdrawn, or a slot granted back, while the cache was
// still switching, lingering, or not yet asked to drop it) stays in the
// cache: SetSlots tells the handlers nothing of its objects, whose requests
// the record refused meanwhile (changes, and the reconciles its release
// cancelled). Their objects are told to the handlers again (Retell) once
// the record holds the slot, so that the instance reconciles them.
func (s *slotMode) followCache(ctx context.Context) {
	var narrow clock.Timer // set while slots linger
	defer func() {
		if narrow != nil {
			narrow.Stop()
		}
	}()
	for {
		narrowNow := false
		var narrowC <-chan time.Time
		if narrow != nil {
			narrowC = narrow.C()
		}
		select {
		case <-ctx.Done():
			return
		case <-s.cacheWant:
		case <-narrowC:
			narrow, narrowNow = nil, true
		}
		s.mu.Lock()
		held := slices.Clone(s.record.Slots)
		gained := s.gained
		s.gained = map[int]bool{}
		s.mu.Unlock()
		// The slots gained that the cache serves already (only followCache
		// changes them) are told again, before the switch, which may take
		// long.
		serving := s.cache.Slots()
		var regained []int
		for _, slot := range serving {
			if _, holds := slices.BinarySearch(held, slot); holds && gained[slot] {
				regained = append(regained, slot)
			}
		}
		want := held
		if !narrowNow {
			want = s.lingering(held, serving)
			if len(want) > len(held) && narrow == nil {
				narrow = s.inst.opts.Clock.NewTimer(s.inst.opts.SlotCacheLinger)
			}
		}
		switchCtx, cancel := context.WithTimeout(ctx, cacheSwitchTimeout)
		var err error
		if len(regained) > 0 {
			if err = s.cache.Retell(switchCtx, regained); err != nil {
				s.mu.Lock()
				for _, slot := range regained {
					s.gained[slot] = true
				}
				s.mu.Unlock()
			} else {
				s.log.Info("Slots taken up again before the cache let go of them: their objects are requested again",
					"slots", slots.FormatList(regained))
			}
		}
		err = errors.Join(err, s.cache.SetSlots(switchCtx, want))
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			s.log.Info("Could not switch the cache to the record's slots; retrying", "error", err.Error())
			if !s.inst.sleep(ctx, s.inst.opts.RetryPeriod) {
				return
			}
			kick(s.cacheWant)
		}
	}
}

// lingering returns the slots the cache should watch for the record's held
// slots while released slots may linger: held, and each slot the cache
// serves and the record no longer holds whose watch group keeps a held
// slot and gains none (its group's cache then stays as it is). Sorted.
func (s *slotMode) lingering(held, serving []int) []int {
	if s.inst.opts.SlotCacheLinger < 0 {
		return held
	}
	count := s.cache.Count()
	keeps, gains := map[int]bool{}, map[int]bool{}
	servingSet := make(map[int]bool, len(serving))
	for _, slot := range serving {
		servingSet[slot] = true
	}
	for _, slot := range held {
		keeps[slots.Group(slot, count)] = true
		if !servingSet[slot] {
			gains[slots.Group(slot, count)] = true
		}
	}
	want := slices.Clone(held)
	for _, slot := range serving {
		group := slots.Group(slot, count)
		if _, holds := slices.BinarySearch(held, slot); !holds && keeps[group] && !gains[group] {
			want = append(want, slot)
		}
	}
	slices.Sort(want)
	return want
}

// Record returns a copy of the record.
func (s *slotMode) Record() slots.Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slots.Record{Revision: s.record.Revision, Slots: slices.Clone(s.record.Slots)}
}

// drop forgets the record for good: the Lease is lost.
func (s *slotMode) drop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dropped = true
	s.record = slots.Record{}
	s.latest = nil
}

// holds reports whether the record holds slot.
func (s *slotMode) holds(slot int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.record.Holds(slot)
}

// begin admits a reconcile of an object of slot when the record holds it,
// registering cancel so that a release of the slot cancels it and waits for
// the returned end function.
func (s *slotMode) begin(slot int, cancel context.CancelCauseFunc) (end func(), ok bool) {
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
func (s *slotMode) slotOf(gk schema.GroupKind, obj metav1.Object) (int, bool) {
	return s.cache.SlotOf(gk, obj)
}

// sleep waits d on the instance's clock; false when ctx ended first.
func (i *Instance) sleep(ctx context.Context, d time.Duration) bool {
	t := i.opts.Clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C():
		return true
	}
}

// checkRingAtSetup reads the ring, if it can, and refuses a cache that does
// not fit its unit. The ring may not exist yet, and an instance in object
// mode need not be allowed to read it: only a ring read and found
// mismatched fails Setup (a slot-mode instance checks again when it
// starts).
func (i *Instance) checkRingAtSetup(c client.Reader, sc *slotcache.Cache) error {
	ctx, cancel := context.WithTimeout(context.Background(), ringReadTimeout)
	defer cancel()
	ring := &v1alpha1.ControllerRing{}
	if err := c.Get(ctx, client.ObjectKey{Name: i.opts.Ring}, ring); err != nil {
		if !apierrors.IsNotFound(err) {
			i.log.V(1).Info("Could not read the ring at setup to check the cache against it", "error", err.Error())
		}
		return nil
	}
	return checkMode(ring, sc)
}
