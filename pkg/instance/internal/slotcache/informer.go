package slotcache

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
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

// registration is a handler added to a fan.
type registration struct {
	f       *fan
	handler toolscache.ResourceEventHandler
	options toolscache.HandlerOptions
	synced  chan struct{}

	fwd map[*group]*forwarder // fan.mu

	mu      sync.Mutex // serializes the handler's events
	removed bool
	// delivered holds, per group, what the handler was told of each
	// object it holds: key to UID, resourceVersion, slot and source.
	delivered map[int]map[string]seen
}

// seen is what a handler was last told of an object.
type seen struct {
	rv   string
	uid  types.UID
	slot int
	src  *group // the cache that told it
}

// add adds a forwarder of r on g's informer inf. fan.mu is held.
func (r *registration) add(g *group, inf cache.Informer) (*forwarder, error) {
	w := &forwarder{r: r, g: g, live: g.serving.Load()}
	h, err := inf.AddEventHandlerWithOptions(w, r.options)
	if err != nil {
		return nil, fmt.Errorf("slotcache: adding a handler in %s: %w", g, err)
	}
	w.handle = h
	r.fwd[g] = w
	return w, nil
}

// HasSynced reports whether the handler was told the contents of the
// groups serving when it was added.
func (r *registration) HasSynced() bool {
	select {
	case <-r.synced:
		return true
	default:
		return false
	}
}

func (r *registration) HasSyncedChecker() toolscache.DoneChecker { return r }
func (r *registration) Name() string                             { return "slot cache handler" }
func (r *registration) Done() <-chan struct{}                    { return r.synced }

// group returns the objects delivered of group num. r.mu is held.
func (r *registration) group(num int) map[string]seen {
	m := r.delivered[num]
	if m == nil {
		m = map[string]seen{}
		r.delivered[num] = m
	}
	return m
}

// handOver tells the handler, for each group of parts, the difference
// between what it knows of the group and next's contents (snapshot, when
// listed), drops silently what it knows of slots no longer held, and tells
// it of the objects of slots still held that old had and next does not
// (deleted). The groups' snapshots are told interleaved, one object of
// each group in turn. It holds r.mu throughout, so that no live event of a
// next cache comes between.
func (r *registration) handOver(ctx context.Context, parts []groupHandOver) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.removed {
		return
	}
	ms := make([]map[string]seen, len(parts))
	present := make([]map[string]bool, len(parts))
	for i := range parts {
		ms[i] = r.group(parts[i].num)
		present[i] = make(map[string]bool, len(parts[i].snapshot))
	}
	for j := 0; ; j++ {
		more := false
		for i := range parts {
			h := &parts[i]
			if !h.listed || j >= len(h.snapshot) {
				continue
			}
			more = true
			r.tell(ctx, h, ms[i], present[i], h.snapshot[j])
		}
		if !more {
			break
		}
	}
	for i := range parts {
		h, m := &parts[i], ms[i]
		for key, s := range m {
			switch {
			case !h.keep[s.slot]:
				delete(m, key) // left the view, not deleted: nothing to tell
			case h.listed && s.src == h.old && !present[i][key]:
				delete(m, key)
				r.handler.OnDelete(toolscache.DeletedFinalStateUnknown{Key: key, Obj: r.f.last(ctx, h.old, key)})
			}
		}
		if len(m) == 0 {
			delete(r.delivered, h.num)
		}
	}
}

// tell tells the handler of obj of h's next snapshot what it does not know
// yet of it (m: what it knows of the group), and marks it present.
func (r *registration) tell(ctx context.Context, h *groupHandOver, m map[string]seen, present map[string]bool, obj client.Object) {
	d, ok := r.f.describe(obj)
	if !ok {
		return
	}
	present[d.key] = true
	s, had := m[d.key]
	if had && s.src == h.next {
		return // told live by next already, of this state or a newer
	}
	m[d.key] = d.seen(h.next)
	if had && s.uid == d.uid && s.rv == d.rv {
		return
	}
	if had && s.uid == d.uid {
		if prev := r.f.lookup(ctx, h.old, d.key); prev != nil {
			r.handler.OnUpdate(prev, obj)
			return
		}
	}
	r.handler.OnAdd(obj, false)
}

// retell tells the handler an Add of each object of snapshot (g's
// contents) whose slot is in set, and records it as told by g unless g told
// it live already (of this state or a newer one).
func (r *registration) retell(g *group, snapshot []client.Object, set map[int]bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.removed {
		return
	}
	m := r.group(g.num)
	for _, obj := range snapshot {
		d, ok := r.f.describe(obj)
		if !ok || !set[d.slot] {
			continue
		}
		if s, had := m[d.key]; !had || s.src != g || s.uid != d.uid {
			m[d.key] = d.seen(g)
		}
		r.handler.OnAdd(obj, false)
	}
	if len(m) == 0 {
		delete(r.delivered, g.num)
	}
}

// forwarder passes the events of one group cache's informer on to a
// registration's handler while that cache serves its group (live).
type forwarder struct {
	r      *registration
	g      *group
	handle toolscache.ResourceEventHandlerRegistration
	live   bool // registration.mu
}

func (w *forwarder) OnAdd(obj any, isInInitialList bool) {
	r := w.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if !w.live || r.removed {
		return
	}
	d, ok := r.f.describe(obj)
	if !ok {
		r.handler.OnAdd(obj, isInInitialList)
		return
	}
	m := r.group(w.g.num)
	s, had := m[d.key]
	m[d.key] = d.seen(w.g)
	if had && s.uid == d.uid && s.rv == d.rv {
		return // told already, by this cache's hand-over or another cache
	}
	r.handler.OnAdd(obj, isInInitialList && !had)
}

func (w *forwarder) OnUpdate(oldObj, newObj any) {
	r := w.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if !w.live || r.removed {
		return
	}
	d, ok := r.f.describe(newObj)
	if !ok {
		r.handler.OnUpdate(oldObj, newObj)
		return
	}
	m := r.group(w.g.num)
	s, had := m[d.key]
	m[d.key] = d.seen(w.g)
	if o, ok := r.f.describe(oldObj); ok && o.rv != d.rv && had && s.uid == d.uid && s.rv == d.rv {
		return // told already; a resync (same resourceVersion) passes
	}
	r.handler.OnUpdate(oldObj, newObj)
}

func (w *forwarder) OnDelete(obj any) {
	r := w.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if !w.live || r.removed {
		return
	}
	d, ok := r.f.describe(obj)
	if !ok {
		r.handler.OnDelete(obj)
		return
	}
	m := r.delivered[w.g.num]
	s, had := m[d.key]
	if !had || (d.uid != "" && s.uid != d.uid) {
		return // told already, or of another object of that name
	}
	delete(m, d.key)
	r.handler.OnDelete(obj)
}

// described is what a handler's record keeps of an object.
type described struct {
	key  string
	rv   string
	uid  types.UID
	slot int
}

func (d described) seen(src *group) seen {
	return seen{rv: d.rv, uid: d.uid, slot: d.slot, src: src}
}

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
