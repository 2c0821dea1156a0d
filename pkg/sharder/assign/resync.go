package assign

import (
	"github.com/sharder-dev/sharder/pkg/drain"
	"github.com/sharder-dev/sharder/pkg/sharder/assign/internal/metacache"
)

// resync is the periodic pass that heals what a lost event left behind: it
// decides about every main object of the ring from the caches and queues
// those that need work (needsWork). Queueing every object instead would
// cost a reconcile per object every ResyncPeriod, and the work queue's
// sets, which never shrink, would keep room for every object of the ring
// for good.
func (r *ringAssigner) resync() {
	view, cfg := r.view.Load(), r.cfg.Load()
	if view == nil {
		return // not started: the first pass queues what needs work
	}
	selected := map[string]bool{} // per namespace: one selector match each, not one per object
	for _, w := range r.mains {
		for obj := range w.cache.List() {
			sel, ok := selected[obj.Namespace]
			if !ok {
				sel = r.selected(obj.Namespace)
				selected[obj.Namespace] = sel
			}
			if !sel {
				if _, seen := r.seen.Load(obj.UID); seen {
					r.enqueue(w, obj) // its reconcile forgets the first-seen time
				}
				continue
			}
			s, err := r.situation(view, cfg, w.res.gk, obj)
			if err != nil || r.needsWork(obj, s, decide(s)) {
				r.enqueue(w, obj)
			}
		}
	}
}

// needsWork reports whether a pass over every object (the first after the
// caches synced, a configuration change, a resync) must queue obj, whose
// decision is d in situation s: unless it stays where it is, its cached
// version predates the sharder's last write to it, or one of its
// controlled objects is not on its instance. Its reconcile would change
// nothing else. It forgets the sharder's last write to obj once the cache
// holds it.
func (r *ringAssigner) needsWork(obj *metacache.Object, s situation, d decision) bool {
	if d.action != actionKeep || r.stale(obj) {
		return true
	}
	for _, c := range r.descendants(obj) {
		if c.obj.Labels[r.shardLabel] != s.current || drain.Requested(c.obj, r.name) {
			return true
		}
	}
	return false
}
