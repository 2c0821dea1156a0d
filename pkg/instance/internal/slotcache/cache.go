package slotcache

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
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
	// manager's (instance.NewCache passes them). Every underlying cache gets
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
	// resources when every main resource is namespaced (instance.Options.ShardedListAndWatch
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
