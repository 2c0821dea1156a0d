package slotcache

import (
	"context"
	"fmt"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

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

func (r *registration) Name() string { return "slot cache handler" }

func (r *registration) Done() <-chan struct{} { return r.synced }

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
