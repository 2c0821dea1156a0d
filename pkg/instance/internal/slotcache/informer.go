package slotcache

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// fan is the informer of one ring kind (and form) across the watch groups:
// each handler added to it is added to the informer of every live group
// cache, present and future, through a forwarder that passes on only the
// events of the cache currently serving its group.
//
// Locks: Cache.mu before fan.mu; registration.mu is taken under neither
// but by forwarders (informer goroutines) and hand-overs, and is held while
// the handler runs, so that a handler's events are sequential.
type fan struct {
	c   *Cache
	key informerKey
	obj client.Object // an empty object of the kind and form

	mu       sync.Mutex
	members  map[*group]cache.Informer
	regs     map[*registration]struct{}
	indexers []toolscache.Indexers
}

var _ cache.Informer = (*fan)(nil)

func newFan(c *Cache, key informerKey, obj client.Object) *fan {
	return &fan{c: c, key: key, obj: obj, members: map[*group]cache.Informer{}, regs: map[*registration]struct{}{}}
}

// attach creates the informer of g's cache for the fan's kind and adds the
// fan's indexers and handlers to it. Cache.mu is held.
func (f *fan) attach(g *group) error {
	inf, err := g.cache.GetInformer(context.Background(), f.obj, cache.BlockUntilSynced(false))
	if err != nil {
		return fmt.Errorf("slotcache: informer of %s in %s: %w", f.key.gvk, g, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, ix := range f.indexers {
		if err := inf.AddIndexers(ix); err != nil {
			return fmt.Errorf("slotcache: indexers of %s in %s: %w", f.key.gvk, g, err)
		}
	}
	f.members[g] = inf
	for r := range f.regs {
		if _, err := r.add(g, inf); err != nil {
			return err
		}
	}
	return nil
}

// detach forgets g (a group cache that stops).
func (f *fan) detach(g *group) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.members, g)
	for r := range f.regs {
		delete(r.fwd, g)
	}
}

// handOverPair is one group's hand-over from old to next (either nil: a
// group new or dropped).
type handOverPair struct{ old, next *group }

// groupHandOver is what a handler's hand-over needs of one group's.
type groupHandOver struct {
	num       int
	old, next *group
	snapshot  []client.Object // next's contents, when listed
	listed    bool
	keep      map[int]bool // next's slots
}

// handOver moves the events of groups from their old caches to their next
// ones: the old forwarders fall silent, the next start, and each handler
// is told the difference between what it knows of each group and its next
// cache's contents (see the package documentation). The groups' objects
// are told interleaved, one of each group in turn, so that a handler's
// queue starts on every group at once rather than on one group after
// another.
func (f *fan) handOver(pairs ...handOverPair) {
	// A handler added from now on gets a live forwarder on next only
	// (next serves already), so the flips below cover every handler.
	type flip struct {
		r           *registration
		from, until *forwarder
	}
	f.mu.Lock()
	regs := make([]*registration, 0, len(f.regs))
	flips := make([]flip, 0, len(f.regs)*len(pairs))
	for r := range f.regs {
		for _, p := range pairs {
			flips = append(flips, flip{r: r, from: r.fwd[p.old], until: r.fwd[p.next]})
			delete(r.fwd, p.old)
		}
		regs = append(regs, r)
	}
	for _, p := range pairs {
		delete(f.members, p.old)
	}
	f.mu.Unlock()
	// Not under fan.mu: a handler may add handlers.
	for _, fl := range flips {
		fl.r.mu.Lock()
		if fl.from != nil {
			fl.from.live = false
		}
		if fl.until != nil {
			fl.until.live = true
		}
		fl.r.mu.Unlock()
	}

	// Listed after next's forwarders went live: a change next's store
	// took before is in the list, one after reaches the handlers live.
	// Before Start there is nothing to list: the informers have not run,
	// and will tell the live forwarders everything. The list and lookups
	// end with the cache, not with the caller's context: a hand-over
	// left half done would keep objects from the handlers.
	ctx := f.c.runContext()
	parts := make([]groupHandOver, len(pairs))
	for i, p := range pairs {
		h := groupHandOver{num: -1, old: p.old, next: p.next, keep: map[int]bool{}}
		if p.old != nil {
			h.num = p.old.num
		}
		if p.next != nil {
			h.num = p.next.num
			for _, s := range p.next.slots {
				h.keep[s] = true
			}
			if ctx != nil && len(regs) > 0 {
				var err error
				h.snapshot, err = f.contents(ctx, p.next)
				h.listed = err == nil
			}
		}
		parts[i] = h
	}
	for _, r := range regs {
		r.handOver(ctx, parts)
	}
}

// retell tells every handler an Add of each object of g's cache (a serving
// one) whose slot is in set.
func (f *fan) retell(ctx context.Context, g *group, set map[int]bool) error {
	f.mu.Lock()
	regs := make([]*registration, 0, len(f.regs))
	for r := range f.regs {
		regs = append(regs, r)
	}
	f.mu.Unlock()
	if len(regs) == 0 {
		return nil
	}
	snapshot, err := f.contents(ctx, g)
	if err != nil {
		return fmt.Errorf("slotcache: listing %s in %s: %w", f.key.gvk, g, err)
	}
	for _, r := range regs {
		r.retell(g, snapshot, set)
	}
	return nil
}

// contents lists the fan's objects in g's cache.
func (f *fan) contents(ctx context.Context, g *group) ([]client.Object, error) {
	list, err := f.c.list(f.key)
	if err != nil {
		return nil, err
	}
	if err := g.cache.List(ctx, list); err != nil {
		return nil, err
	}
	items, err := apimeta.ExtractList(list)
	if err != nil {
		return nil, err
	}
	out := make([]client.Object, 0, len(items))
	for _, item := range items {
		if obj, ok := item.(client.Object); ok {
			out = append(out, obj)
		}
	}
	return out, nil
}

// lookup returns g's copy of the object with store key key, or nil.
func (f *fan) lookup(ctx context.Context, g *group, key string) client.Object {
	if g == nil {
		return nil
	}
	ns, name, err := toolscache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	obj, ok := f.obj.DeepCopyObject().(client.Object)
	if !ok {
		return nil
	}
	if err := g.cache.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, obj); err != nil {
		return nil
	}
	return obj
}

// last returns the last known state of a deleted object: g's copy, or an
// object carrying only its name and namespace.
func (f *fan) last(ctx context.Context, g *group, key string) client.Object {
	if obj := f.lookup(ctx, g, key); obj != nil {
		return obj
	}
	obj, _ := f.obj.DeepCopyObject().(client.Object)
	if ns, name, err := toolscache.SplitMetaNamespaceKey(key); err == nil && obj != nil {
		obj.SetNamespace(ns)
		obj.SetName(name)
	}
	return obj
}

// AddEventHandler adds handler to every group's informer, present and
// future. The registration has synced once the handler was told the
// contents of the groups serving when it was added.
func (f *fan) AddEventHandler(handler toolscache.ResourceEventHandler) (toolscache.ResourceEventHandlerRegistration, error) {
	return f.AddEventHandlerWithOptions(handler, toolscache.HandlerOptions{})
}

// AddEventHandlerWithResyncPeriod is AddEventHandler with a resync period.
func (f *fan) AddEventHandlerWithResyncPeriod(handler toolscache.ResourceEventHandler, resyncPeriod time.Duration) (toolscache.ResourceEventHandlerRegistration, error) {
	return f.AddEventHandlerWithOptions(handler, toolscache.HandlerOptions{ResyncPeriod: &resyncPeriod})
}

// AddEventHandlerWithOptions is AddEventHandler with options.
func (f *fan) AddEventHandlerWithOptions(handler toolscache.ResourceEventHandler, options toolscache.HandlerOptions) (toolscache.ResourceEventHandlerRegistration, error) {
	r := &registration{
		f:         f,
		handler:   handler,
		options:   options,
		fwd:       map[*group]*forwarder{},
		synced:    make(chan struct{}),
		delivered: map[int]map[string]seen{},
	}
	type waitFor struct {
		handle toolscache.ResourceEventHandlerRegistration
		g      *group
	}
	var initial []waitFor
	f.mu.Lock()
	for g, inf := range f.members {
		w, err := r.add(g, inf)
		if err != nil {
			for g, w := range r.fwd {
				_ = f.members[g].RemoveEventHandler(w.handle)
			}
			f.mu.Unlock()
			return nil, err
		}
		if w.live {
			initial = append(initial, waitFor{handle: w.handle, g: g})
		}
	}
	f.regs[r] = struct{}{}
	f.mu.Unlock()
	go func() {
		defer close(r.synced)
		for _, w := range initial {
			select {
			case <-w.handle.HasSyncedChecker().Done():
			case <-w.g.gone:
			case <-f.c.done:
				return
			}
		}
	}()
	return r, nil
}

// RemoveEventHandler removes a handler added to the fan.
func (f *fan) RemoveEventHandler(handle toolscache.ResourceEventHandlerRegistration) error {
	r, ok := handle.(*registration)
	if !ok || r.f != f {
		return errors.New("slotcache: not a registration of this informer")
	}
	f.mu.Lock()
	delete(f.regs, r)
	var errs []error
	for g, w := range r.fwd {
		if inf := f.members[g]; inf != nil {
			errs = append(errs, inf.RemoveEventHandler(w.handle))
		}
	}
	r.fwd = map[*group]*forwarder{}
	f.mu.Unlock()
	r.mu.Lock()
	r.removed = true
	r.delivered = nil
	r.mu.Unlock()
	return errors.Join(errs...)
}

// AddIndexers adds indexers to every group's informer, present and future.
func (f *fan) AddIndexers(indexers toolscache.Indexers) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, inf := range f.members {
		if err := inf.AddIndexers(indexers); err != nil {
			return err
		}
	}
	f.indexers = append(f.indexers, indexers)
	return nil
}

// serving returns the informers of the groups serving.
func (f *fan) serving() []cache.Informer {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []cache.Informer
	for g, inf := range f.members {
		if g.serving.Load() {
			out = append(out, inf)
		}
	}
	return out
}

// HasSynced reports whether the informers of all serving groups synced.
func (f *fan) HasSynced() bool {
	for _, inf := range f.serving() {
		if !inf.HasSynced() {
			return false
		}
	}
	return true
}

// HasSyncedChecker is done once the informers of the groups serving now
// synced.
func (f *fan) HasSyncedChecker() toolscache.DoneChecker {
	infs := f.serving()
	d := &doneChecker{name: fmt.Sprintf("slot cache informer of %s", f.key.gvk), done: make(chan struct{})}
	go func() {
		for _, inf := range infs {
			select {
			case <-inf.HasSyncedChecker().Done():
			case <-f.c.done:
				return
			}
		}
		close(d.done)
	}()
	return d
}

// IsStopped reports whether the cache stopped.
func (f *fan) IsStopped() bool {
	select {
	case <-f.c.done:
		return true
	default:
		return false
	}
}

type doneChecker struct {
	name string
	done chan struct{}
}

func (d *doneChecker) Name() string          { return d.name }
func (d *doneChecker) Done() <-chan struct{} { return d.done }

// describe returns an object of the fan's kind's store key,
// resourceVersion, UID and slot (-1 when it has none: see Cache.SlotOf).
func (f *fan) describe(obj any) (described, bool) {
	if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		d, _ := f.describe(t.Obj)
		d.key = t.Key
		return d, true
	}
	a, err := apimeta.Accessor(obj)
	if err != nil {
		return described{slot: -1}, false
	}
	key := a.GetName()
	if ns := a.GetNamespace(); ns != "" {
		key = ns + "/" + key
	}
	slot, ok := f.c.SlotOf(f.key.gvk.GroupKind(), a)
	if !ok {
		slot = -1
	}
	return described{key: key, rv: a.GetResourceVersion(), uid: a.GetUID(), slot: slot}, true
}
