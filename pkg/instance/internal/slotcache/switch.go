package slotcache

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	"github.com/sharder-dev/sharder/pkg/slots"
)

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
