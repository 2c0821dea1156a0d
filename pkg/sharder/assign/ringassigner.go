package assign

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/drain"
	"github.com/sharder-dev/sharder/pkg/sharder/assign/internal/metacache"
	"github.com/sharder-dev/sharder/pkg/sharder/assign/internal/owners"
)

// Retry delays of a failed object.
const (
	retryBaseDelay = 5 * time.Millisecond
	retryMaxDelay  = time.Minute
)

// item is a work item: a main object of the ring. Its resource is the
// resource's cache rather than its GroupKind: the work queue hashes every
// item several times per object (its sets and the urgency order), and a
// pointer hashes faster than two strings.
type item struct {
	res       *resourceCache
	namespace string
	name      string
}

// resourceCache is a resource of a ring with its metadata cache.
type resourceCache struct {
	res   resource
	cache *metacache.Cache
}

// ringAssigner is the machinery of one ring: its caches, work queue,
// workers and status writer. It runs from start until stop.
type ringAssigner struct {
	c          *Controller
	name       string
	shardLabel string
	drainLabel string
	logger     logr.Logger

	cfg  atomic.Pointer[ringConfig]
	view atomic.Pointer[ringView]

	byGK       map[schema.GroupKind]*resourceCache
	resolve    owners.Resolver
	mains      []*resourceCache
	controlled []*resourceCache
	namespaces *metacache.Cache
	// transform makes the objects of every cache of the ring.
	transform *metacache.ObjectTransform

	queue   workqueue.TypedRateLimitingInterface[item]
	drains  *drainTimes
	seen    sync.Map // UID -> time.Time an unassigned main object was first seen
	written sync.Map // UID -> int64 resourceVersion of the sharder's last write
	synced  atomic.Bool

	membership chan struct{}
	reconfig   chan struct{}
	status     chan struct{}

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func newRingAssigner(c *Controller, cfg *ringConfig) *ringAssigner {
	r := &ringAssigner{
		c:          c,
		name:       cfg.name,
		shardLabel: v1alpha1.ShardLabel(cfg.name),
		drainLabel: v1alpha1.DrainLabel(cfg.name),
		logger:     c.logger.WithValues("ring", cfg.name),
		byGK:       map[schema.GroupKind]*resourceCache{},
		transform:  metacache.NewObjectTransform(cfg.name),
		drains:     newDrainTimes(c.opts.Clock),
		membership: make(chan struct{}, 1),
		reconfig:   make(chan struct{}, 1),
		status:     make(chan struct{}, 1),
	}
	r.cfg.Store(cfg)
	r.queue = newWorkQueue(c.opts.Clock, r.urgent)
	for _, res := range cfg.resources {
		w := r.newResourceCache(res)
		r.byGK[res.gk] = w
		if res.main {
			r.mains = append(r.mains, w)
		} else {
			r.controlled = append(r.controlled, w)
		}
	}
	r.namespaces = metacache.NewNamespaces(c.meta, r.watchChanged)
	r.namespaces.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { r.namespaceChanged(nil, obj) },
		UpdateFunc: r.namespaceChanged,
	})
	r.resolve = r.resolver()
	return r
}

// newWorkQueue returns a ring's work queue: rate-limited retries, delayed
// items, urgent items first.
func newWorkQueue(clk clock.WithTicker, urgent func(item) bool) workqueue.TypedRateLimitingInterface[item] {
	return workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[item](retryBaseDelay, retryMaxDelay),
		workqueue.TypedRateLimitingQueueConfig[item]{
			Clock: clk,
			DelayingQueue: workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[item]{
				Clock: clk,
				Queue: workqueue.NewTypedWithConfig(workqueue.TypedQueueConfig[item]{
					Clock: clk,
					Queue: newUrgencyQueue(urgent),
				}),
			}),
		},
	)
}

func (r *ringAssigner) config() *ringConfig { return r.cfg.Load() }

// newResourceCache builds the metadata cache of res with its event
// handlers.
func (r *ringAssigner) newResourceCache(res resource) *resourceCache {
	// Only controlled objects are indexed (by controller): a namespace's
	// objects are found by a scan, as its labels rarely change, and every
	// index costs memory per object.
	w := &resourceCache{res: res}
	opts := metacache.Options{
		IndexByController: !res.main,
		OnWatchChange:     r.watchChanged,
	}
	if cfg := r.cfg.Load(); res.namespaced && cfg.namespaces != nil {
		opts.Namespaces = cfg.namespaces
	}
	w.cache = metacache.NewObjects(r.c.meta, res.gvr, r.transform, opts)
	if res.main {
		w.cache.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { r.mainChanged(w, nil, obj) },
			UpdateFunc: func(oldObj, newObj any) { r.mainChanged(w, oldObj, newObj) },
			DeleteFunc: r.mainDeleted,
		})
	} else {
		w.cache.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { r.controlledChanged(w, nil, obj) },
			UpdateFunc: func(oldObj, newObj any) { r.controlledChanged(w, oldObj, newObj) },
		})
	}
	return w
}

// watchChanged answers a failed list or watch of a cache of the ring, and
// the first one accepted after a failure (err nil).
func (r *ringAssigner) watchChanged(gvr schema.GroupVersionResource, err error) {
	r.triggerStatus()
	switch {
	case err == nil:
		r.logger.Info("Resource is listed and watched again", "resource", gvr.String())
	case !errors.Is(err, context.Canceled):
		r.logger.Info("Cannot list or watch resource", "resource", gvr.String(), "error", err.Error())
	}
}

// notServed reports whether a resource of the ring is not served: it was
// unknown when the ring was resolved, or its list or watch found nothing
// since (its CustomResourceDefinition was deleted, or no longer serves the
// version watched).
func (r *ringAssigner) notServed() bool {
	if len(r.config().unresolved) > 0 {
		return true
	}
	for _, c := range r.caches() {
		if p := c.Problem(); p != nil && p.Reason == v1alpha1.ReasonResourceNotServed {
			return true
		}
	}
	return false
}

// start runs the ring's caches and workers until stop or ctx is done.
func (r *ringAssigner) start(ctx context.Context) {
	ctx, r.cancel = context.WithCancel(ctx)
	ctx = logf.IntoContext(ctx, r.logger)
	for _, c := range r.caches() {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			c.Run(ctx)
		}()
	}
	r.wg.Add(2)
	go func() {
		defer r.wg.Done()
		r.statusLoop(ctx)
	}()
	go func() {
		defer r.wg.Done()
		r.run(ctx)
	}()
}

// stop stops the ring and waits for its goroutines.
func (r *ringAssigner) stop() {
	r.cancel()
	r.queue.ShutDown()
	r.wg.Wait()
	r.c.opts.Registry.SetAssigned(r.name, nil)
}

// caches returns every metadata cache of the ring.
func (r *ringAssigner) caches() []*metacache.Cache {
	all := make([]*metacache.Cache, 0, len(r.mains)+len(r.controlled)+1)
	for _, w := range r.mains {
		all = append(all, w.cache)
	}
	for _, w := range r.controlled {
		all = append(all, w.cache)
	}
	return append(all, r.namespaces)
}

// run waits for the caches, then starts the workers and answers membership
// changes, configuration changes and resyncs.
func (r *ringAssigner) run(ctx context.Context) {
	r.triggerStatus()
	err := wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(context.Context) (bool, error) {
		for _, c := range r.caches() {
			if !c.HasSynced() && !c.Failed() {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return
	}
	r.synced.Store(true)
	r.logger.Info("Caches synced")
	r.rebuild(ctx, true)

	var workers sync.WaitGroup
	for range r.c.opts.Workers {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for r.processNext(ctx) {
			}
		}()
	}
	defer workers.Wait()
	defer r.queue.ShutDown()

	resync := r.c.opts.Clock.NewTicker(*r.c.opts.ResyncPeriod)
	defer resync.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.membership:
			r.rebuild(ctx, false)
		case <-r.reconfig:
			r.rebuild(ctx, true)
		case <-resync.C():
			r.resync()
		}
	}
}

func (r *ringAssigner) processNext(ctx context.Context) bool {
	it, quit := r.queue.Get()
	if quit {
		return false
	}
	defer r.queue.Done(it)
	after, err := r.reconcile(ctx, it)
	if err != nil {
		if ctx.Err() == nil {
			if apierrors.IsConflict(err) {
				r.logger.V(1).Info("Object changed meanwhile, deciding again", "kind", it.res.res.gk.String(), "object", klog.KRef(it.namespace, it.name))
			} else {
				r.logger.Error(err, "Cannot assign object", "kind", it.res.res.gk.String(), "object", klog.KRef(it.namespace, it.name))
			}
		}
		r.queue.AddRateLimited(it)
		return true
	}
	r.queue.Forget(it)
	if after > 0 {
		r.queue.AddAfter(it, after)
	}
	return true
}

// urgent reports whether it waits for nothing but the sharder: its object
// is unassigned (new, or its drain was acknowledged) or assigned to an
// instance that is gone. Urgent items are processed before the others.
func (r *ringAssigner) urgent(it item) bool {
	w := it.res
	if w == nil {
		return false
	}
	obj, ok := w.cache.Get(it.namespace, it.name)
	if !ok {
		return false
	}
	view, cfg := r.view.Load(), r.cfg.Load()
	if view == nil {
		return obj.Labels[r.shardLabel] == ""
	}
	return r.urgentObject(view, cfg, w.res.gk, obj)
}

// urgentObject reports whether decide would answer obj with an urgent
// action. The work queue asks it for every object it takes in, so it
// answers from the object's labels and its instance's state without
// looking the object up in the ring: the ring holds ready instances only,
// so an object on a gone instance is never on its target, and an object
// with no instance gets one whenever the ring has any. Only an object
// released by a forced move (no shard label, a drain label) needs the
// whole decision, for its grace.
func (r *ringAssigner) urgentObject(view *ringView, cfg *ringConfig, gk schema.GroupKind, obj *metacache.Object) bool {
	if view.empty {
		return false // no ready instance: nothing moves
	}
	current := obj.Labels[r.shardLabel]
	if current != "" {
		state, movable, _ := view.stateOf(current, r.c.opts.Clock.Now())
		return state.Gone() && movable
	}
	if !drain.Requested(obj, r.name) {
		return true
	}
	s, err := r.situation(view, cfg, gk, obj)
	return err == nil && decide(s).action.urgent()
}

// notifyMembership asks the ring assigner to rebuild its ring; it never blocks.
func (r *ringAssigner) notifyMembership() {
	select {
	case r.membership <- struct{}{}:
	default:
	}
}

// reconfigure applies a new spec that watches the same resources.
func (r *ringAssigner) reconfigure(cfg *ringConfig) {
	r.cfg.Store(cfg)
	select {
	case r.reconfig <- struct{}{}:
	default:
	}
	r.triggerStatus()
}

func (r *ringAssigner) triggerStatus() {
	select {
	case r.status <- struct{}{}:
	default:
	}
}

func (r *ringAssigner) enqueue(w *resourceCache, obj metav1.Object) {
	r.queue.Add(item{res: w, namespace: obj.GetNamespace(), name: obj.GetName()})
}

// selected reports whether objects of namespace belong to the ring.
// Cluster-scoped objects always do. An unknown namespace does not (yet).
func (r *ringAssigner) selected(namespace string) bool {
	if namespace == "" {
		return true
	}
	ns, ok := r.namespaces.GetNamespace(namespace)
	if !ok {
		return false
	}
	return r.cfg.Load().selector.Matches(labelsOf(ns))
}

func (r *ringAssigner) mainChanged(w *resourceCache, oldObj, newObj any) {
	obj, ok := newObj.(*metacache.Object)
	if !ok {
		return
	}
	if obj.Labels[r.shardLabel] == "" && r.selected(obj.Namespace) {
		r.seen.LoadOrStore(obj.UID, r.c.opts.Clock.Now())
	}
	if !r.synced.Load() {
		return // the first pass after the caches sync queues what needs work
	}
	if old, ok := oldObj.(*metacache.Object); ok && !r.labelsChanged(old, obj) {
		return
	}
	r.enqueue(w, obj)
	r.triggerStatus()
}

func (r *ringAssigner) mainDeleted(obj any) {
	if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	m, ok := obj.(*metacache.Object)
	if !ok {
		return
	}
	r.seen.Delete(m.UID)
	r.written.Delete(m.UID)
	r.drains.End(m.UID)
	r.triggerStatus()
}

func (r *ringAssigner) controlledChanged(w *resourceCache, oldObj, newObj any) {
	obj, ok := newObj.(*metacache.Object)
	if !ok || !r.synced.Load() {
		return // the first pass after the caches sync looks at every controlled object's owner
	}
	if old, ok := oldObj.(*metacache.Object); ok &&
		!r.labelsChanged(old, obj) && old.ControllerUID() == obj.ControllerUID() {
		return
	}
	if root, ok := r.rootOf(w.res.gk, obj); ok {
		r.queue.Add(root)
	}
}

func (r *ringAssigner) namespaceChanged(oldObj, newObj any) {
	ns, ok := newObj.(*metav1.PartialObjectMetadata)
	if !ok {
		return
	}
	if old, ok := oldObj.(*metav1.PartialObjectMetadata); ok && equalLabels(old.Labels, ns.Labels) {
		return
	}
	if !r.synced.Load() {
		return // the first pass after the caches sync looks at every object
	}
	for _, w := range r.mains {
		if !w.res.namespaced {
			continue
		}
		for obj := range w.cache.List() {
			if obj.Namespace == ns.Name {
				r.enqueue(w, obj)
			}
		}
	}
	r.triggerStatus()
}

func (r *ringAssigner) labelsChanged(a, b *metacache.Object) bool {
	return a.Labels[r.shardLabel] != b.Labels[r.shardLabel] ||
		drain.Requested(a, r.name) != drain.Requested(b, r.name)
}

// stale reports whether the cache still holds a version of obj older than
// the sharder's last write to it: deciding on it would undo that write.
func (r *ringAssigner) stale(obj *metacache.Object) bool {
	v, ok := r.written.Load(obj.UID)
	if !ok {
		return false
	}
	have, err := strconv.ParseInt(obj.ResourceVersion, 10, 64)
	if err == nil && have < v.(int64) {
		return true
	}
	r.written.CompareAndDelete(obj.UID, v)
	return false
}

// noteWrite remembers the resourceVersion the sharder's write produced.
func (r *ringAssigner) noteWrite(uid types.UID, resourceVersion string) {
	if rv, err := strconv.ParseInt(resourceVersion, 10, 64); err == nil {
		r.written.Store(uid, rv)
	}
}
