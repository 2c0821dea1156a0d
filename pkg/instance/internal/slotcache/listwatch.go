package slotcache

import (
	"context"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"
)

// firstListInformer returns a cache.Options.NewInformer whose informers
// fill themselves with a LIST and then watch, as client-go did before its
// streaming lists (the WatchListClient feature, on by default since 1.35):
// informers are created by next with a ListerWatcher that tells the
// reflector it does not support streaming.
//
// A group cache selects a few slots of a resource that may hold a million
// objects. The API server's watch cache answers a streaming list (a watch
// with sendInitialEvents) by building a watch event for every object of the
// resource, whatever the selector, and sorting them: for each watch, about
// 150 bytes per object of the resource (its event, and two slices of
// pointers), 150 MB and seconds of CPU at a million objects. An instance runs up to 64 group caches, and a ring's instances
// start theirs at the same time; ten instances of a ring of a million
// objects took a kube-apiserver past 21 GiB. The watch cache answers a LIST
// by filtering its objects in place, and the watch that follows starts at
// the list's resourceVersion, with no initial events.
//
// When g is set, each informer of a ring kind asks first, for its first
// list, for its part of g's batch (g.batch), if g has one.
func firstListInformer(c *Cache, g *group, next newInformerFunc) newInformerFunc {
	return func(lw toolscache.ListerWatcher, obj runtime.Object, resync time.Duration, indexers toolscache.Indexers) toolscache.SharedIndexInformer {
		l := &listThenWatch{ListerWatcher: lw, ctx: toolscache.ToListerWatcherWithContext(lw)}
		if g != nil {
			if key, ring, err := c.classify(obj); err == nil && ring {
				l.first = func(ctx context.Context) (runtime.Object, bool) { return g.batch.take(ctx, key, g) }
			}
		}
		return next(l, obj, resync, indexers)
	}
}

// listThenWatch is a ListerWatcher that does not support streaming lists
// (client-go's watchlist.DoesClientNotSupportWatchListSemantics).
type listThenWatch struct {
	toolscache.ListerWatcher
	ctx toolscache.ListerWatcherWithContext
	// first, when set, may answer the first list (a batch's part).
	first func(ctx context.Context) (runtime.Object, bool)
	asked atomic.Bool
}

// ListWithContext lists as a consistent read where the reflector would
// read the watch cache at any age (resourceVersion "0", its first list):
// the objects of a slot just granted were written by their old holder
// before it acknowledged the release, and a list older than those writes
// would start the new holder on states the old one already moved past.
// Since Kubernetes 1.34 the API server serves a consistent LIST from its
// watch cache once that cache caught up with etcd, so it costs the same
// pass over the cache.
func (l *listThenWatch) ListWithContext(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
	if l.first != nil && l.asked.CompareAndSwap(false, true) {
		if list, ok := l.first(ctx); ok {
			return list, nil
		}
	}
	if opts.ResourceVersion == "0" {
		opts.ResourceVersion, opts.ResourceVersionMatch = "", ""
	}
	return l.ctx.ListWithContext(ctx, opts)
}

func (l *listThenWatch) WatchWithContext(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	return l.ctx.WatchWithContext(ctx, opts)
}

// IsWatchListSemanticsUnSupported tells client-go's reflector to list, then
// watch.
func (*listThenWatch) IsWatchListSemanticsUnSupported() bool { return true }
