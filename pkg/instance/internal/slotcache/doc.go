// Package slotcache is the cache of an instance of a ring in slot mode
// (docs/design.md §11): a controller-runtime cache.Cache that selects the
// ring's resources by the instance's slots, one underlying cache per watch
// group, and changes the slots it watches while it runs.
//
// The ring's slots are cut into at most 64 watch groups of consecutive slots
// (slots.Group). For each group in which the instance holds a slot, the
// cache runs one underlying controller-runtime cache whose ring resources
// are selected by slot.sharder.dev/<ring> in (<the instance's slots of the
// group>). Cache.SetSlots changes the slots: a group whose slots changed gets
// a new underlying cache; reads and events of the group keep coming from the
// old one until the new one has synced, then switch to it, and the old one
// stops. The objects of the group's other slots therefore never leave the
// view, and the groups whose slots did not change are not touched. A group
// left without a slot is stopped and dropped. Kinds that are not the ring's
// are served by one plain cache with the manager's options, as a manager's
// own cache would serve them.
//
// # Selecting by shard
//
// On a ring whose slots are keyed by namespace, the slots are ranges of the
// FNV-1a hash of the namespace, which the API server's sharded list and
// watch selects (Kubernetes 1.36, ShardedListAndWatch gate). The resources
// of Options.Sharded are selected that way: each group cache's watch of
// such a resource carries the shard selector of the group's slots
// (slots.ShardSelector: shardRange(object.metadata.namespace, start, end)
// || ...), set through cache.Options.NewInformer on the ListWatch, instead
// of the slot label selector, and so receives an object before its slot
// label is written. The slot of an object of such a resource is its slot
// label's, or, while it has none, its namespace's (SlotOf). The cache does
// not trust the server to filter: a server without the gate ignores the
// selector silently, and a 1.36 server does not filter the watches it
// serves without its watch cache. Each list and watch event is checked,
// and an object outside the group's slots is dropped before the informer
// sees it (counted by ShardStats, and logged once), so the cache holds the
// same objects either way. An object's namespace never changes and its
// slot label is written once, to its namespace's slot, so an object never
// enters or leaves a running watch, as with the label selector.
//
// # The cache is late, the record decides
//
// The cache may be late about which objects exist: after SetSlots returns
// it holds the objects of the slots asked for, but a slot's objects stay
// visible until the switch of its group (and a watch that is behind may
// even deliver events of them meanwhile), and an object of a slot just added
// appears only when its group's new cache has synced. The slot label never
// changes, so the cache is never wrong about an object's slot. An instance
// must therefore admit a reconcile by its record of the slots it holds
// (slots.Record), never by the presence of the object in this cache: a
// request for an object of a slot the instance let go of may still arrive,
// and a Get of it may still succeed, after the record lost the slot.
//
// # Events across group changes
//
// GetInformer returns, for a ring kind, an informer that spans the groups
// and survives their changes: a handler added to it receives the events of
// every group cache that serves reads, including caches started after the
// handler was added. When a group switches to a new cache, each handler gets
// the difference between what it was last told and the new cache's
// contents: an Add for an object it has not been told of (an object of a
// slot just added), an Update for an object whose resourceVersion changed
// meanwhile, nothing for an object it already has at its current version,
// and a Delete only for an object of a slot still held that the new cache
// does not hold (it was deleted). Objects of a slot given up, and all
// objects of a group dropped, leave the view silently: no Delete event, since
// they were not deleted, and a controller told they were could clean up
// after objects that still exist. A request already queued for such an
// object is refused by the instance's record. A handler's record of them is
// dropped with them: should one be deleted while its slot is away and the
// slot come back, the handler is not told of the deletion (the object is
// just not added again). Handlers keep no state per object in
// controller-runtime, and cleanup on deletion rests on finalizers, which keep
// an object until its controller removed them.
//
// The cache tells handlers of a slot's objects only when the slot joins a
// group's watch. An instance whose record let go of a slot and took it up
// again while the cache still watched it (a release withdrawn before the
// cache let go) refused the requests of the slot's objects meanwhile: it
// calls Retell, which tells every handler an Add of each object of the slot
// again.
//
// To compute that difference, each handler keeps the key, UID and
// resourceVersion of every object it was told of (tens of bytes per object
// and handler). Events are at least once: around a switch, a handler may be
// told of one change twice, once by each cache. Reconciles are level-triggered
// and re-read the object, so a repeated event costs a reconcile, never
// correctness.
package slotcache
