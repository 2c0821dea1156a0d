package slotcache

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/sharder-dev/sharder/pkg/slots"
)

// SlotOf returns the slot of an object of kind gk as the cache sees it:
// the slot its slot label names; for a kind selected by the shard selector
// (Options.Sharded) whose object carries no slot label yet, the slot of its
// namespace (slots.ForNamespace), which is the slot the sharder will write
// (a main object's of a ring of key Namespace, or a controlled object's
// when every main resource is namespaced: its controller is in its
// namespace). ok is false when the label names no slot of the ring, or is
// missing on an object of a kind selected by the label.
func (c *Cache) SlotOf(gk schema.GroupKind, obj metav1.Object) (slot int, ok bool) {
	if value, labelled := obj.GetLabels()[c.label]; labelled {
		slot, err := slots.ParseLabel(value, c.count)
		return slot, err == nil
	}
	if c.ring[gk].sharded {
		return slots.ForNamespace(obj.GetNamespace(), c.count), true
	}
	return 0, false
}

// Sharded returns the ring resources selected by the shard selector
// (Options.Sharded), by group and kind; none when every ring resource is
// selected by the slot label.
func (c *Cache) Sharded() []schema.GroupKind {
	var out []schema.GroupKind
	for gk, rk := range c.ring {
		if rk.sharded {
			out = append(out, gk)
		}
	}
	slices.SortFunc(out, func(a, b schema.GroupKind) int {
		return cmp.Or(strings.Compare(a.Group, b.Group), strings.Compare(a.Kind, b.Kind))
	})
	return out
}

// ShardStats counts the objects the API server returned to the watches
// that select by shard (lists and watch events alike, since the cache
// started): Received, and of those OutsideSlots, the objects of slots the
// watch did not ask for, which the cache dropped. An API server that
// filters by shard selector returns none outside (OutsideSlots is 0); one
// without the ShardedListAndWatch gate, older than 1.36, or serving a
// watch without its watch cache (Kubernetes 1.36 does not filter those)
// returns every object, and the cache keeps only its slots' at the cost of
// receiving the others.
type ShardStats struct {
	Received, OutsideSlots int64
}

// ShardStats returns the counts of the objects the watches selecting by
// shard received.
func (c *Cache) ShardStats() ShardStats {
	return ShardStats{Received: c.shardReceived.Load(), OutsideSlots: c.shardOutside.Load()}
}

// shardCounters are the Cache's counts behind ShardStats.
type shardCounters struct {
	shardReceived, shardOutside atomic.Int64
	warned                      atomic.Bool
}

// newInformerFunc is cache.Options.NewInformer.
type newInformerFunc = func(toolscache.ListerWatcher, runtime.Object, time.Duration, toolscache.Indexers) toolscache.SharedIndexInformer

// shardedInformer returns the cache.Options.NewInformer of a group cache of
// slots held: the ListWatch of a sharded ring kind gets the group's shard
// selector and a filter that keeps only the objects of held; every other
// informer is created by next (or client-go's default).
func (c *Cache) shardedInformer(held []int, next newInformerFunc) newInformerFunc {
	selector := slots.ShardSelector(held, c.count).String()
	set := make(map[int]bool, len(held))
	for _, s := range held {
		set[s] = true
	}
	return func(lw toolscache.ListerWatcher, obj runtime.Object, resync time.Duration, indexers toolscache.Indexers) toolscache.SharedIndexInformer {
		if gvk, err := apiutil.GVKForObject(obj, c.base.Scheme); err == nil && c.ring[gvk.GroupKind()].sharded {
			lw = c.shardedListWatch(lw, gvk.GroupKind(), set, selector)
		}
		return next(lw, obj, resync, indexers)
	}
}

// shardedListWatch wraps lw: its lists and watches carry the shard
// selector, and return only the objects of the slots set.
func (c *Cache) shardedListWatch(lw toolscache.ListerWatcher, gk schema.GroupKind, set map[int]bool, selector string) *toolscache.ListWatch {
	inner := toolscache.ToListerWatcherWithContext(lw)
	keep := func(obj runtime.Object) bool {
		a, err := apimeta.Accessor(obj)
		if err != nil {
			return true // not an object: the reflector deals with it
		}
		c.shardReceived.Add(1)
		if slot, ok := c.SlotOf(gk, a); ok && set[slot] {
			return true
		}
		c.shardOutside.Add(1)
		if c.warned.CompareAndSwap(false, true) {
			logf.Log.WithName("slotcache").WithValues("ring", c.name).Info(
				"The API server returned an object outside the shard selector's ranges: it does not filter by shard selector "+
					"(a server older than 1.36 or without the ShardedListAndWatch feature gate, or a watch served without the watch cache). "+
					"The cache drops such objects itself, but receives every object of the resource",
				"kind", gk.String(), "shardSelector", selector)
		}
		return false
	}
	return &toolscache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.ShardSelector = selector
			list, err := inner.ListWithContext(ctx, opts)
			if err != nil {
				return nil, err
			}
			items, err := apimeta.ExtractList(list)
			if err != nil {
				return nil, err
			}
			kept := make([]runtime.Object, 0, len(items))
			for _, item := range items {
				if keep(item) {
					kept = append(kept, item)
				}
			}
			if len(kept) < len(items) {
				if err := apimeta.SetList(list, kept); err != nil {
					return nil, err
				}
			}
			return list, nil
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.ShardSelector = selector
			w, err := inner.WatchWithContext(ctx, opts)
			if err != nil {
				return nil, err
			}
			return watch.Filter(w, func(e watch.Event) (watch.Event, bool) {
				switch e.Type {
				case watch.Added, watch.Modified, watch.Deleted:
					return e, keep(e.Object)
				default: // bookmarks (the end of the initial events among them) and errors
					return e, true
				}
			}), nil
		},
	}
}
