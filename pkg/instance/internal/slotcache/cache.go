package slotcache

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/slots"
)

// Options configures New.
type Options struct {
	// Ring is the ring's name: the cache selects the ring's resources by
	// the label slot.sharder.dev/<Ring>. Required.
	Ring string
	// Count is the ring's slot count (spec.assignment.slots.count, 1 to
	// 16384). Required.
	Count int
	// Objects holds one empty object of each of the ring's resources that
	// the instance reads or watches, e.g. &corev1.ConfigMap{}: their reads
	// and informers are served by the groups' caches. Required.
	Objects []client.Object
	// Cache are the options of the underlying caches, usually the
	// manager's (NewCacheFunc passes them). Every underlying cache gets
	// them; the group caches add the group's slot selector to the ring's
	// resources (ANDed with a label selector the options set for them).
	// Scheme, Mapper and HTTPClient are defaulted as cache.New defaults
	// them, and shared by all underlying caches.
	Cache cache.Options
	// Sharded holds an empty object of each ring resource of Objects whose
	// watches select the instance's slots with the API server's shard
	// selector on the namespace (Kubernetes 1.36 with the
	// ShardedListAndWatch feature gate: shardRange(object.metadata.namespace,
	// start, end) || ..., slots.ShardSelector) instead of the slot label, so
	// that they receive an object before the sharder wrote its slot label.
	// Only for a ring of slot key Namespace, whose slots are ranges of the
	// namespace's hash; for its main resources, and for its controlled
	// resources when every main resource is namespaced (instance.SlotCacheWith
	// chooses them from the ring). The slot of an object of these resources
	// is its slot label's, or, while it has none, its namespace's
	// (slots.ForNamespace): SlotOf. The cache checks every object it receives
	// and keeps only those of the watch's slots, since an API server without
	// the gate ignores the shard selector silently (ShardStats counts what it
	// dropped). Default: none, every ring resource is selected by its slot
	// label.
	Sharded []client.Object

	// FromRing records that Count and Sharded were read off the ring when
	// the cache was made, so that the instance need not read the ring
	// again to check them before it starts.
	FromRing bool
}

// Cache is a cache.Cache of an instance of a ring in slot mode: the ring's
// resources are served by one underlying cache per watch group holding any
// of the instance's slots, everything else by one plain cache. See the
// package documentation, in particular: the cache may be late about which
// objects exist, so reconciles must be admitted by the instance's record of
// its slots, never by the cache.
//
// It holds no slot until SetSlots: its ring resources are then empty.
type Cache struct {
	cfg   *rest.Config
	base  cache.Options
	name  string
	label string
	count int
	// fromRing is Options.FromRing.
	fromRing bool
	// ring maps each ring kind to its object and whether it is namespaced.
	ring  map[schema.GroupKind]ringKind
	plain cache.Cache
	// lister lists the ring's resources for batches, from the API server.
	lister client.Reader

	switching sync.Mutex // one SetSlots at a time

	mu sync.RWMutex
	// groups are the group caches serving reads and events, by group.
	groups map[int]*group
	// live are all group caches not stopped: serving, or syncing to serve.
	live map[*group]struct{}
	// fans are the informers of the ring kinds handed out, per kind and
	// form; every live group cache has an informer for each.
	fans    map[informerKey]*fan
	indexes []index
	// runCtx is the context the group caches run in, set by Start.
	runCtx  context.Context
	stopped bool
	started chan struct{} // closed by Start
	done    chan struct{} // closed when Start returns
	wg      sync.WaitGroup
	errs    chan error
	running atomic.Int64
	shardCounters
}

type ringKind struct {
	obj        client.Object
	namespaced bool
	// sharded: selected by the shard selector on the namespace (Options.Sharded).
	sharded bool
}

// index is a field index of a ring kind, applied to every group cache.
type index struct {
	obj     client.Object
	field   string
	extract client.IndexerFunc
}

// group is one underlying cache of a watch group.
type group struct {
	num      int
	slots    []int
	selector labels.Selector
	cache    cache.Cache
	// batch, when set, holds the first list of the group's informers
	// (set before the cache starts).
	batch *batch
	// serving: reads and events of the group come from this cache.
	serving atomic.Bool
	cancel  context.CancelFunc // nil until started
	done    chan struct{}      // closed when its Start returned
	gone    chan struct{}      // closed when it no longer serves nor syncs
	once    sync.Once
}

func (g *group) String() string {
	return fmt.Sprintf("group %d (slots %s)", g.num, slots.FormatList(g.slots))
}

// stop stops the group's cache and waits for it.
func (g *group) stop() {
	if g.cancel == nil {
		return
	}
	g.cancel()
	<-g.done
}

var _ cache.Cache = (*Cache)(nil)

// New returns a slot cache for opts.Ring. It holds no slot: call SetSlots.
func New(cfg *rest.Config, opts Options) (*Cache, error) {
	switch {
	case opts.Ring == "":
		return nil, errors.New("slotcache: no ring")
	case opts.Count < 1 || opts.Count > v1alpha1.MaxSlotCount:
		return nil, fmt.Errorf("slotcache: slot count %d out of [1, %d]", opts.Count, v1alpha1.MaxSlotCount)
	case len(opts.Objects) == 0:
		return nil, errors.New("slotcache: no ring resources")
	}
	base := opts.Cache
	if base.HTTPClient == nil {
		hc, err := rest.HTTPClientFor(cfg)
		if err != nil {
			return nil, fmt.Errorf("slotcache: HTTP client: %w", err)
		}
		base.HTTPClient = hc
	}
	if base.Scheme == nil {
		base.Scheme = scheme.Scheme
	}
	if base.Mapper == nil {
		m, err := apiutil.NewDynamicRESTMapper(cfg, base.HTTPClient)
		if err != nil {
			return nil, fmt.Errorf("slotcache: REST mapper: %w", err)
		}
		base.Mapper = m
	}
	c := &Cache{
		cfg:      cfg,
		base:     base,
		name:     opts.Ring,
		label:    v1alpha1.SlotLabel(opts.Ring),
		count:    opts.Count,
		fromRing: opts.FromRing,
		ring:     map[schema.GroupKind]ringKind{},
		groups:   map[int]*group{},
		live:     map[*group]struct{}{},
		fans:     map[informerKey]*fan{},
		started:  make(chan struct{}),
		done:     make(chan struct{}),
		errs:     make(chan error, 1),
	}
	for _, obj := range opts.Objects {
		gvk, err := apiutil.GVKForObject(obj, base.Scheme)
		if err != nil {
			return nil, fmt.Errorf("slotcache: ring resource %T: %w", obj, err)
		}
		namespaced, err := apiutil.IsObjectNamespaced(obj, base.Scheme, base.Mapper)
		if err != nil {
			return nil, fmt.Errorf("slotcache: ring resource %s: %w", gvk, err)
		}
		c.ring[gvk.GroupKind()] = ringKind{obj: obj, namespaced: namespaced}
	}
	for _, obj := range opts.Sharded {
		gvk, err := apiutil.GVKForObject(obj, base.Scheme)
		if err != nil {
			return nil, fmt.Errorf("slotcache: sharded resource %T: %w", obj, err)
		}
		rk, ok := c.ring[gvk.GroupKind()]
		if !ok {
			return nil, fmt.Errorf("slotcache: sharded resource %s is not one of the ring's resources (Objects)", gvk.GroupKind())
		}
		rk.sharded = true
		c.ring[gvk.GroupKind()] = rk
	}
	plainOpts := base
	plainOpts.ByObject = map[client.Object]cache.ByObject{}
	for obj, byObject := range base.ByObject {
		gvk, err := apiutil.GVKForObject(obj, base.Scheme)
		if err != nil {
			return nil, fmt.Errorf("slotcache: cache options for %T: %w", obj, err)
		}
		if _, ring := c.ring[gvk.GroupKind()]; !ring {
			plainOpts.ByObject[obj] = byObject
		}
	}
	plain, err := cache.New(cfg, plainOpts)
	if err != nil {
		return nil, fmt.Errorf("slotcache: plain cache: %w", err)
	}
	c.plain = plain
	lister, err := client.New(cfg, client.Options{HTTPClient: base.HTTPClient, Scheme: base.Scheme, Mapper: base.Mapper})
	if err != nil {
		return nil, fmt.Errorf("slotcache: client: %w", err)
	}
	c.lister = lister
	// Every group cache watches every ring kind, whether or not anyone
	// asked for its informer yet: one watch per resource and group.
	for _, rk := range c.ring {
		key, _, err := c.classify(rk.obj)
		if err != nil {
			return nil, err
		}
		if _, err := c.fanFor(key); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// SetSlots makes the cache watch slots (within [0, count); any order), the
// slots the instance holds by its record. For each watch group whose slots
// changed it starts a new underlying cache with the group's new selector,
// waits until it has synced, then switches the group's reads and events to
// it and stops the old one: meanwhile the group is served by the old cache,
// so the objects of its other slots never leave the view. Groups left
// without a slot are stopped and dropped at once; groups whose slots did not
// change keep their caches. Each group switches as soon as its new cache
// synced. SetSlots returns once every changed group has switched, or with
// an error when a new cache could not sync before ctx
// ended (those groups keep their old caches and slots; call SetSlots
// again). Calls are serialized.
//
// Before Start it only records the slots: the group caches start with the
// cache. Whatever it returns, the cache may still be late about which
// objects exist (see the package documentation): the instance's record, not
// the cache, admits reconciles.
func (c *Cache) SetSlots(ctx context.Context, held []int) error {
	held = slices.Clone(held)
	slices.Sort(held)
	held = slices.Compact(held)
	for _, s := range held {
		if s < 0 || s >= c.count {
			return fmt.Errorf("slotcache: slot %d out of [0, %d)", s, c.count)
		}
	}
	selectors, err := slots.GroupSelectors(c.label, held, c.count)
	if err != nil {
		return err
	}
	byGroup := map[int][]int{}
	for _, s := range held {
		g := slots.Group(s, c.count)
		byGroup[g] = append(byGroup[g], s)
	}

	c.switching.Lock()
	defer c.switching.Unlock()

	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return errors.New("slotcache: cache stopped")
	}
	var incoming []*group
	for _, num := range slices.Sorted(maps.Keys(selectors)) {
		if cur := c.groups[num]; cur != nil && slices.Equal(cur.slots, byGroup[num]) {
			continue
		}
		g, err := c.newGroup(num, byGroup[num], selectors[num])
		if err != nil {
			for _, g := range incoming {
				c.detach(g)
			}
			c.mu.Unlock()
			return err
		}
		incoming = append(incoming, g)
	}
	var dropped []*group
	for num, cur := range c.groups {
		if _, held := selectors[num]; !held {
			dropped = append(dropped, cur)
			delete(c.groups, num)
			cur.serving.Store(false)
		}
	}
	started := c.runCtx != nil
	if started {
		// The groups starting together list each ring kind once.
		b := c.newBatch(incoming)
		defer b.close()
		for _, g := range incoming {
			g.batch = b
			c.run(g)
		}
	}
	c.mu.Unlock()

	for _, g := range dropped {
		c.handOver(handOverPair{old: g})
	}
	// Each group switches as soon as its cache synced: a group whose list
	// is slow does not hold back the others. The groups that synced while
	// the previous switch ran switch together, their objects told to the
	// handlers interleaved.
	errs := make([]error, len(incoming))
	ready := make(chan *group, len(incoming))
	var wg sync.WaitGroup
	for i, g := range incoming {
		wg.Go(func() {
			if started {
				if errs[i] = c.awaitSynced(ctx, g); errs[i] != nil {
					c.mu.Lock()
					c.detach(g)
					c.mu.Unlock()
					g.stop()
					return
				}
			}
			ready <- g
		})
	}
	go func() {
		wg.Wait()
		close(ready)
	}()
	for g := range ready {
		gs := []*group{g}
	more:
		for {
			select {
			case h, ok := <-ready:
				if !ok {
					break more
				}
				gs = append(gs, h)
			default:
				break more
			}
		}
		c.switchTo(gs...)
	}
	return errors.Join(errs...)
}

// switchTo makes each of gs (synced, or not started yet) serve its group
// in place of the group's current cache, and hands the groups' events over
// to them.
func (c *Cache) switchTo(gs ...*group) {
	pairs := make([]handOverPair, 0, len(gs))
	c.mu.Lock()
	for _, g := range gs {
		old := c.groups[g.num]
		c.groups[g.num] = g
		if old != nil {
			old.serving.Store(false)
		}
		g.serving.Store(true)
		pairs = append(pairs, handOverPair{old: old, next: g})
	}
	c.mu.Unlock()
	c.handOver(pairs...)
}

// newGroup creates the cache of group num selecting slots by selector,
// with the informers of every fan and every index, and makes it live. c.mu
// is held.
func (c *Cache) newGroup(num int, held []int, selector labels.Selector) (*group, error) {
	opts := c.base
	opts.ByObject = make(map[client.Object]cache.ByObject, len(c.ring))
	sharded := false
	for gk, rk := range c.ring {
		byObject := c.baseByObject(gk)
		bySlot := selector
		if rk.sharded {
			// Selected by the shard selector (shardedInformer), and by the
			// options' label selector only.
			bySlot, sharded = nil, true
		}
		byObject.Label = and(byObject.Label, c.base.DefaultLabelSelector, bySlot)
		if rk.namespaced {
			namespaces := byObject.Namespaces
			if namespaces == nil {
				namespaces = c.base.DefaultNamespaces
			}
			if len(namespaces) > 0 {
				byObject.Namespaces = make(map[string]cache.Config, len(namespaces))
				for ns, cfg := range namespaces {
					if cfg.LabelSelector != nil {
						cfg.LabelSelector = and(cfg.LabelSelector, nil, bySlot)
					}
					byObject.Namespaces[ns] = cfg
				}
			}
		}
		opts.ByObject[rk.obj] = byObject
	}
	g := &group{num: num, slots: held, selector: selector, done: make(chan struct{}), gone: make(chan struct{})}
	opts.NewInformer = c.groupInformer(g, sharded)
	gc, err := cache.New(c.cfg, opts)
	if err != nil {
		return nil, fmt.Errorf("slotcache: cache of slot group %d: %w", num, err)
	}
	g.cache = gc
	c.live[g] = struct{}{}
	for _, ix := range c.indexes {
		if err := gc.IndexField(context.Background(), ix.obj, ix.field, ix.extract); err != nil {
			c.detach(g)
			return nil, fmt.Errorf("slotcache: index %s of slot group %d: %w", ix.field, num, err)
		}
	}
	for _, f := range c.fans {
		if err := f.attach(g); err != nil {
			c.detach(g)
			return nil, err
		}
	}
	return g, nil
}

// groupInformer returns the cache.Options.NewInformer of group g's cache:
// its informers list, then watch (firstListInformer), their first list
// taken from g's batch when it has one, with the ListWatch a sharded ring
// kind's informer gets (shardedInformer) when sharded; they are created by
// the base options' NewInformer, or client-go's default.
func (c *Cache) groupInformer(g *group, sharded bool) newInformerFunc {
	next := c.base.NewInformer
	if next == nil {
		next = toolscache.NewSharedIndexInformer
	}
	// Innermost: the ListerWatcher the informer gets must be the one that
	// declines streaming, whatever wraps it before.
	next = firstListInformer(c, g, next)
	if sharded {
		next = c.shardedInformer(g.slots, next)
	}
	return next
}

// baseByObject returns the base options' ByObject entry of a ring kind.
func (c *Cache) baseByObject(gk schema.GroupKind) cache.ByObject {
	for obj, byObject := range c.base.ByObject {
		gvk, err := apiutil.GVKForObject(obj, c.base.Scheme)
		if err == nil && gvk.GroupKind() == gk {
			return byObject
		}
	}
	return cache.ByObject{}
}

// and returns selector ANDed with the requirements of first, or of
// fallback when first is nil.
func and(first, fallback, selector labels.Selector) labels.Selector {
	if first == nil {
		first = fallback
	}
	if selector == nil {
		return first
	}
	if first == nil || first.Empty() {
		return selector
	}
	reqs, _ := first.Requirements()
	return selector.Add(reqs...)
}

// detach removes a group that never served from the fans and the live
// caches. c.mu is held.
func (c *Cache) detach(g *group) {
	g.once.Do(func() { close(g.gone) })
	delete(c.live, g)
	for _, f := range c.fans {
		f.detach(g)
	}
}

// run starts a group's cache in the cache's run context. c.mu is held.
func (c *Cache) run(g *group) {
	ctx, cancel := context.WithCancel(c.runCtx)
	g.cancel = cancel
	c.running.Add(1)
	c.wg.Go(func() {
		defer close(g.done)
		defer c.running.Add(-1)
		if err := g.cache.Start(ctx); err != nil && ctx.Err() == nil {
			select {
			case c.errs <- fmt.Errorf("slotcache: %s: %w", g, err):
			default:
			}
		}
	})
}

// awaitSynced waits until g's cache has synced, or ctx or the cache ended.
func (c *Cache) awaitSynced(ctx context.Context, g *group) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c.mu.RLock()
	runCtx := c.runCtx
	c.mu.RUnlock()
	stop := context.AfterFunc(runCtx, cancel)
	defer stop()
	if !g.cache.WaitForCacheSync(ctx) {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("slotcache: %s did not sync: %w", g, err)
		}
		return fmt.Errorf("slotcache: %s did not sync", g)
	}
	return nil
}

// handOver moves the events of groups from their old caches to their next
// ones (either may be nil: a group new or dropped) on every fan, then
// stops the old ones. Reads were switched already.
func (c *Cache) handOver(pairs ...handOverPair) {
	c.mu.RLock()
	fans := slices.Collect(maps.Values(c.fans))
	c.mu.RUnlock()
	for _, f := range fans {
		f.handOver(pairs...)
	}
	for _, p := range pairs {
		if p.old != nil {
			c.mu.Lock()
			c.detach(p.old)
			c.mu.Unlock()
			p.old.stop()
		}
	}
}

// runContext returns the context the caches run in, nil before Start.
func (c *Cache) runContext() context.Context {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.runCtx
}

// FromRing reports whether the cache's slot count and selection were read
// off the ring when it was made (Options.FromRing).
func (c *Cache) FromRing() bool { return c.fromRing }

// Ring returns the name of the ring whose slots the cache selects.
func (c *Cache) Ring() string { return c.name }

// Count returns the ring's slot count the cache was created with.
func (c *Cache) Count() int { return c.count }

// Groups returns the watch groups the cache serves, ascending.
func (c *Cache) Groups() []int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return slices.Sorted(maps.Keys(c.groups))
}

// Slots returns the slots the cache serves, ascending: those of its
// serving group caches (SetSlots changes them once a group's new cache
// synced, so they may differ from the slots last asked for).
func (c *Cache) Slots() []int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	var out []int
	for _, g := range c.groups {
		out = append(out, g.slots...)
	}
	slices.Sort(out)
	return out
}

// Retell tells every handler added to the informers of the ring kinds an
// Add of each object of slots (any order; slots the cache does not serve
// are ignored) that the serving group caches hold, whether or not the
// handler was told of it already. SetSlots tells a handler of the objects of
// a slot only when the slot joins a group's watch; an instance that let go
// of a slot and took it up again before its cache let go of it (a release
// withdrawn) dropped the requests of the slot's objects meanwhile, and
// calls Retell so that they are requested again. Retell waits for a
// SetSlots in progress, and does nothing before Start (the informers tell
// their handlers everything when they start). The handlers may thus be told
// of an object twice; reconciles are level-triggered.
func (c *Cache) Retell(ctx context.Context, slots []int) error {
	if len(slots) == 0 {
		return nil
	}
	set := make(map[int]bool, len(slots))
	for _, s := range slots {
		set[s] = true
	}
	c.switching.Lock()
	defer c.switching.Unlock()
	groups, started := c.serving()
	if !started {
		return nil
	}
	c.mu.RLock()
	fans := slices.Collect(maps.Values(c.fans))
	c.mu.RUnlock()
	var errs []error
	for _, g := range groups {
		if !slices.ContainsFunc(g.slots, func(s int) bool { return set[s] }) {
			continue
		}
		for _, f := range fans {
			if err := f.retell(ctx, g, set); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// RunningCaches returns the number of underlying group caches running:
// one per group served, plus those syncing to replace one, until they
// switched. The plain cache is not counted.
func (c *Cache) RunningCaches() int { return int(c.running.Load()) }

// serving returns the serving groups by ascending group, and whether the
// cache started.
func (c *Cache) serving() ([]*group, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make([]*group, 0, len(c.groups))
	for _, num := range slices.Sorted(maps.Keys(c.groups)) {
		out = append(out, c.groups[num])
	}
	return out, c.runCtx != nil
}

// Start runs the plain cache and the group caches of the slots set so far
// until ctx ends, and the caches SetSlots starts later. It blocks; it
// returns an error when called twice or when an underlying cache fails.
func (c *Cache) Start(ctx context.Context) error {
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	c.mu.Lock()
	if c.runCtx != nil {
		c.mu.Unlock()
		return errors.New("slotcache: already started")
	}
	c.runCtx = runCtx
	for g := range c.live {
		c.run(g)
	}
	close(c.started)
	c.mu.Unlock()

	plainDone := make(chan error, 1)
	go func() { plainDone <- c.plain.Start(runCtx) }()
	var err error
	select {
	case <-ctx.Done():
	case err = <-plainDone:
		plainDone <- err
		if err == nil {
			<-ctx.Done()
		}
	case err = <-c.errs:
	}
	c.mu.Lock()
	c.stopped = true
	c.mu.Unlock()
	cancel()
	if plainErr := <-plainDone; plainErr != nil && err == nil {
		err = plainErr
	}
	c.wg.Wait()
	close(c.done)
	return err
}

// WaitForCacheSync waits until the cache started and the plain cache and
// every serving group cache synced. It returns false when ctx ended first.
func (c *Cache) WaitForCacheSync(ctx context.Context) bool {
	select {
	case <-c.started:
	case <-ctx.Done():
		return false
	}
	groups, _ := c.serving()
	if !c.plain.WaitForCacheSync(ctx) {
		return false
	}
	for _, g := range groups {
		if !g.cache.WaitForCacheSync(ctx) {
			return false
		}
	}
	return true
}

// Form of the objects of an informer: typed, unstructured or metadata only.
type form int

const (
	structured form = iota
	unstructuredForm
	metadataForm
)

// informerKey names the informers of a kind and form.
type informerKey struct {
	gvk  schema.GroupVersionKind
	form form
}

// classify returns the informer key of obj (an object or a list) and
// whether it is a ring kind.
func (c *Cache) classify(obj runtime.Object) (informerKey, bool, error) {
	gvk, err := apiutil.GVKForObject(obj, c.base.Scheme)
	if err != nil {
		return informerKey{}, false, err
	}
	key := informerKey{gvk: gvk}
	switch obj.(type) {
	case *unstructured.Unstructured, *unstructured.UnstructuredList:
		key.form = unstructuredForm
	case *metav1.PartialObjectMetadata, *metav1.PartialObjectMetadataList:
		key.form = metadataForm
	}
	if apimeta.IsListType(obj) {
		key.gvk.Kind = strings.TrimSuffix(key.gvk.Kind, "List")
	}
	_, ring := c.ring[key.gvk.GroupKind()]
	return key, ring, nil
}

// object returns an empty object of key.
func (c *Cache) object(key informerKey) (client.Object, error) {
	switch key.form {
	case unstructuredForm:
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(key.gvk)
		return u, nil
	case metadataForm:
		m := &metav1.PartialObjectMetadata{}
		m.SetGroupVersionKind(key.gvk)
		return m, nil
	}
	o, err := c.base.Scheme.New(key.gvk)
	if err != nil {
		return nil, err
	}
	obj, ok := o.(client.Object)
	if !ok {
		return nil, fmt.Errorf("slotcache: %s is not an object", key.gvk)
	}
	return obj, nil
}

// list returns an empty list of key's objects.
func (c *Cache) list(key informerKey) (client.ObjectList, error) {
	gvk := key.gvk
	gvk.Kind += "List"
	switch key.form {
	case unstructuredForm:
		u := &unstructured.UnstructuredList{}
		u.SetGroupVersionKind(gvk)
		return u, nil
	case metadataForm:
		m := &metav1.PartialObjectMetadataList{}
		m.SetGroupVersionKind(gvk)
		return m, nil
	}
	o, err := c.base.Scheme.New(gvk)
	if err != nil {
		return nil, err
	}
	l, ok := o.(client.ObjectList)
	if !ok {
		return nil, fmt.Errorf("slotcache: %s is not a list", gvk)
	}
	return l, nil
}

// fanFor returns the informer of key across the groups, creating it and
// the informers of every live group cache when needed.
func (c *Cache) fanFor(key informerKey) (*fan, error) {
	c.mu.RLock()
	f := c.fans[key]
	c.mu.RUnlock()
	if f != nil {
		return f, nil
	}
	obj, err := c.object(key)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if f := c.fans[key]; f != nil {
		return f, nil
	}
	f = newFan(c, key, obj)
	for g := range c.live {
		if err := f.attach(g); err != nil {
			return nil, err
		}
	}
	c.fans[key] = f
	return f, nil
}

// Get reads an object. An object of a ring kind is looked up in each
// serving group's cache (its group is known from its slot label only once
// it is read); it is not found when no group holds it, whether it does not
// exist or belongs to a slot the instance does not hold (or no longer
// shows: see the package documentation).
func (c *Cache) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	ik, ring, err := c.classify(obj)
	if err != nil {
		return err
	}
	if !ring {
		return c.plain.Get(ctx, key, obj, opts...)
	}
	groups, started := c.serving()
	if !started {
		return &cache.ErrCacheNotStarted{}
	}
	if _, err := c.fanFor(ik); err != nil {
		return err
	}
	for _, g := range groups {
		err := g.cache.Get(ctx, key, obj, opts...)
		if err == nil || !apierrors.IsNotFound(err) {
			return err
		}
	}
	resource := ik.gvk.Kind
	if m, err := c.base.Mapper.RESTMapping(ik.gvk.GroupKind(), ik.gvk.Version); err == nil {
		resource = m.Resource.Resource
	}
	return apierrors.NewNotFound(schema.GroupResource{Group: ik.gvk.Group, Resource: resource}, key.Name)
}

// List lists objects. Objects of a ring kind are listed from every serving
// group's cache with the options given (namespace, label and field
// selectors, limit) and merged, by ascending group. Continue is not
// supported.
func (c *Cache) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	ik, ring, err := c.classify(list)
	if err != nil {
		return err
	}
	if !ring {
		return c.plain.List(ctx, list, opts...)
	}
	listOpts := client.ListOptions{}
	listOpts.ApplyOptions(opts)
	if listOpts.Continue != "" {
		return errors.New("slotcache: the continue list option is not supported by the cache")
	}
	groups, started := c.serving()
	if !started {
		return &cache.ErrCacheNotStarted{}
	}
	if _, err := c.fanFor(ik); err != nil {
		return err
	}
	var items []runtime.Object
	resourceVersion := ""
	for _, g := range groups {
		part, ok := list.DeepCopyObject().(client.ObjectList)
		if !ok {
			return fmt.Errorf("slotcache: %T is not a list", list)
		}
		if err := g.cache.List(ctx, part, &listOpts); err != nil {
			return err
		}
		got, err := apimeta.ExtractList(part)
		if err != nil {
			return err
		}
		items = append(items, got...)
		resourceVersion = part.GetResourceVersion()
		if listOpts.Limit > 0 {
			listOpts.Limit -= int64(len(got))
			if listOpts.Limit <= 0 {
				break
			}
		}
	}
	if err := apimeta.SetList(list, items); err != nil {
		return err
	}
	list.SetResourceVersion(resourceVersion)
	list.SetContinue("")
	return nil
}

// GetInformer returns the informer of obj's kind. For a ring kind it spans
// the serving group caches and keeps delivering events across group
// changes (see the package documentation); unless BlockUntilSynced(false)
// is given it waits for the serving groups' informers to sync once the
// cache started.
func (c *Cache) GetInformer(ctx context.Context, obj client.Object, opts ...cache.InformerGetOption) (cache.Informer, error) {
	key, ring, err := c.classify(obj)
	if err != nil {
		return nil, err
	}
	if !ring {
		return c.plain.GetInformer(ctx, obj, opts...)
	}
	return c.ringInformer(ctx, key, opts)
}

// GetInformerForKind is GetInformer for a kind given by its
// GroupVersionKind (typed objects).
func (c *Cache) GetInformerForKind(ctx context.Context, gvk schema.GroupVersionKind, opts ...cache.InformerGetOption) (cache.Informer, error) {
	if _, ring := c.ring[gvk.GroupKind()]; !ring {
		return c.plain.GetInformerForKind(ctx, gvk, opts...)
	}
	return c.ringInformer(ctx, informerKey{gvk: gvk}, opts)
}

func (c *Cache) ringInformer(ctx context.Context, key informerKey, opts []cache.InformerGetOption) (cache.Informer, error) {
	f, err := c.fanFor(key)
	if err != nil {
		return nil, err
	}
	var getOpts cache.InformerGetOptions
	for _, o := range opts {
		o(&getOpts)
	}
	groups, started := c.serving()
	if started && (getOpts.BlockUntilSynced == nil || *getOpts.BlockUntilSynced) {
		for _, g := range groups {
			if _, err := g.cache.GetInformer(ctx, f.obj, opts...); err != nil {
				return nil, err
			}
		}
	}
	return f, nil
}

// RemoveInformer removes the informer of a kind that is not the ring's.
// The informers of the ring's kinds are the groups' watches and cannot be
// removed.
func (c *Cache) RemoveInformer(ctx context.Context, obj client.Object) error {
	key, ring, err := c.classify(obj)
	if err != nil {
		return err
	}
	if ring {
		return fmt.Errorf("slotcache: the informer of ring resource %s cannot be removed", key.gvk.GroupKind())
	}
	return c.plain.RemoveInformer(ctx, obj)
}

// IndexField adds a field index. An index of a ring kind is added to every
// group cache, present and future.
func (c *Cache) IndexField(ctx context.Context, obj client.Object, field string, extract client.IndexerFunc) error {
	_, ring, err := c.classify(obj)
	if err != nil {
		return err
	}
	if !ring {
		return c.plain.IndexField(ctx, obj, field, extract)
	}
	c.mu.Lock()
	proto, ok := obj.DeepCopyObject().(client.Object)
	if !ok {
		c.mu.Unlock()
		return fmt.Errorf("slotcache: %T is not an object", obj)
	}
	c.indexes = append(c.indexes, index{obj: proto, field: field, extract: extract})
	groups := slices.Collect(maps.Keys(c.live))
	c.mu.Unlock()
	sort.Slice(groups, func(i, j int) bool { return groups[i].num < groups[j].num })
	for _, g := range groups {
		if err := g.cache.IndexField(ctx, obj, field, extract); err != nil {
			return fmt.Errorf("slotcache: index %s of %s: %w", field, g, err)
		}
	}
	return nil
}
