package assign

import (
	"context"
	"errors"
	"fmt"
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
	"k8s.io/client-go/metadata/metadatainformer"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/assign/internal/owners"
	"github.com/sharder-dev/sharder/pkg/drain"
	"github.com/sharder-dev/sharder/pkg/membership"
)

// Index names of the metadata caches.
const (
	// indexController maps an object to the UID of its controller.
	indexController = "controller"
)

// Retry delays of a failed object.
const (
	retryBaseDelay = 5 * time.Millisecond
	retryMaxDelay  = time.Minute
)

// namespacesResource is the resource of the Namespace cache every ring keeps
// for its namespaceSelector.
var namespacesResource = resource{
	gvr: schema.GroupVersionResource{Version: "v1", Resource: "namespaces"},
	gk:  schema.GroupKind{Kind: "Namespace"},
}

// item is a work item: a main object of the ring.
type item struct {
	gk        schema.GroupKind
	namespace string
	name      string
}

// watched is one metadata cache of a ring.
type watched struct {
	res      resource
	informer toolscache.SharedIndexInformer

	mu       sync.Mutex
	watchErr error // last list or watch error; a resource that never synced reports it
	patchErr error // last Forbidden answer to a patch; cleared by a successful patch
}

func (w *watched) get(namespace, name string) (*object, bool) {
	obj, ok := w.getAny(namespace, name)
	m, isObject := obj.(*object)
	return m, ok && isObject
}

// getNamespace returns a Namespace from the Namespace cache.
func (w *watched) getNamespace(name string) (*metav1.PartialObjectMetadata, bool) {
	obj, ok := w.getAny("", name)
	m, isNamespace := obj.(*metav1.PartialObjectMetadata)
	return m, ok && isNamespace
}

func (w *watched) getAny(namespace, name string) (any, bool) {
	key := name
	if namespace != "" {
		key = namespace + "/" + name
	}
	obj, ok, err := w.informer.GetIndexer().GetByKey(key)
	if err != nil || !ok {
		return nil, false
	}
	return obj, true
}

func (w *watched) setWatchErr(err error) {
	w.mu.Lock()
	w.watchErr = err
	w.mu.Unlock()
}

func (w *watched) setPatchErr(err error) {
	w.mu.Lock()
	w.patchErr = err
	w.mu.Unlock()
}

// problem returns what keeps the sharder from using w, nil when nothing does.
func (w *watched) problem() *resourceProblem {
	w.mu.Lock()
	watchErr, patchErr := w.watchErr, w.patchErr
	w.mu.Unlock()
	gr := w.res.gvr.GroupResource()
	switch {
	case patchErr != nil:
		return &resourceProblem{gr: gr, reason: v1alpha1.ReasonResourceForbidden, message: fmt.Sprintf(
			"the sharder may not patch %q (%v): grant its ServiceAccount patch on this resource", gr.String(), patchErr)}
	case watchErr == nil || w.informer.HasSynced():
		return nil
	case apierrors.IsForbidden(watchErr):
		return &resourceProblem{gr: gr, reason: v1alpha1.ReasonResourceForbidden, message: fmt.Sprintf(
			"the sharder may not list and watch %q (%v): grant its ServiceAccount get, list, watch and patch on this resource", gr.String(), watchErr)}
	case apierrors.IsNotFound(watchErr):
		return &resourceProblem{gr: gr, reason: v1alpha1.ReasonResourceNotServed, message: fmt.Sprintf(
			"resource %q is not served by the API server (%v): install its CustomResourceDefinition or correct spec.resources", gr.String(), watchErr)}
	default:
		return nil // transient: still syncing
	}
}

// failed reports whether w cannot sync: the sharder does not wait for it.
func (w *watched) failed() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.watchErr != nil && (apierrors.IsForbidden(w.watchErr) || apierrors.IsNotFound(w.watchErr))
}

// runner is the machinery of one ring: its caches, work queue, workers and
// status writer. It runs from start until stop.
type runner struct {
	c          *Controller
	name       string
	shardLabel string
	drainLabel string
	logger     logr.Logger

	cfg  atomic.Pointer[ringConfig]
	view atomic.Pointer[ringView]
	// rings keeps the ring built from the last membership.
	rings membership.Rings
	// unknownUntil ends the hold of instances that are not members; set
	// once the caches have synced.
	unknownUntil time.Time

	byGK       map[schema.GroupKind]*watched
	resolve    owners.Resolver
	mains      []*watched
	controlled []*watched
	namespaces *watched

	queue   workqueue.TypedRateLimitingInterface[item]
	drains  *drain.Tracker
	seen    sync.Map // UID -> time.Time an unassigned main object was first seen
	written sync.Map // UID -> int64 resourceVersion of the sharder's last write
	synced  atomic.Bool
	shared  sharedValues // strings and label maps shared by cached objects

	membership chan struct{}
	reconfig   chan struct{}
	status     chan struct{}

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func newRunner(c *Controller, cfg *ringConfig) *runner {
	r := &runner{
		c:          c,
		name:       cfg.name,
		shardLabel: v1alpha1.ShardLabel(cfg.name),
		drainLabel: v1alpha1.DrainLabel(cfg.name),
		logger:     log.Log.WithName("assign").WithValues("ring", cfg.name),
		byGK:       map[schema.GroupKind]*watched{},
		drains:     drain.NewTracker(c.opts.Clock),
		membership: make(chan struct{}, 1),
		reconfig:   make(chan struct{}, 1),
		status:     make(chan struct{}, 1),
	}
	r.cfg.Store(cfg)
	clk := c.opts.Clock
	r.queue = workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[item](retryBaseDelay, retryMaxDelay),
		workqueue.TypedRateLimitingQueueConfig[item]{
			Clock: clk,
			DelayingQueue: workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[item]{
				Clock: clk,
				Queue: workqueue.NewTypedWithConfig(workqueue.TypedQueueConfig[item]{
					Clock: clk,
					Queue: newUrgencyQueue(r.urgent),
				}),
			}),
		},
	)
	for _, res := range cfg.resources {
		w := r.newWatched(res)
		r.byGK[res.gk] = w
		if res.main {
			r.mains = append(r.mains, w)
		} else {
			r.controlled = append(r.controlled, w)
		}
	}
	r.namespaces = r.newWatched(namespacesResource)
	r.resolve = r.resolver()
	return r
}

func (r *runner) config() *ringConfig { return r.cfg.Load() }

// newWatched builds the metadata informer of res with its transform,
// indexes and event handlers.
func (r *runner) newWatched(res resource) *watched {
	// Only the controller index is kept: a namespace's objects are found by
	// a scan, as its labels rarely change, and every index costs memory per
	// object.
	indexers := toolscache.Indexers{}
	if !res.main && res != namespacesResource {
		indexers[indexController] = indexByController
	}
	inf := metadatainformer.NewFilteredMetadataInformer(r.c.meta, res.gvr, metav1.NamespaceAll, 0, indexers, nil).Informer()
	w := &watched{res: res, informer: inf}
	transform := r.transformObject
	if res == namespacesResource {
		transform = transformNamespace
	}
	// Errors only come from calls made after the informer started; none is made yet.
	_ = inf.SetTransform(transform)
	_ = inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, _ *toolscache.Reflector, err error) {
		w.setWatchErr(err)
		r.triggerStatus()
		if !errors.Is(err, context.Canceled) {
			r.logger.Info("Cannot list or watch resource", "resource", res.gvr.String(), "error", err.Error())
		}
	})
	var handler toolscache.ResourceEventHandler
	switch {
	case res == namespacesResource:
		handler = toolscache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { r.namespaceChanged(nil, obj) },
			UpdateFunc: r.namespaceChanged,
		}
	case res.main:
		handler = toolscache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { r.mainChanged(w, nil, obj) },
			UpdateFunc: func(oldObj, newObj any) { r.mainChanged(w, oldObj, newObj) },
			DeleteFunc: r.mainDeleted,
		}
	default:
		handler = toolscache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { r.controlledChanged(w, nil, obj) },
			UpdateFunc: func(oldObj, newObj any) { r.controlledChanged(w, oldObj, newObj) },
		}
	}
	_, _ = inf.AddEventHandler(handler)
	return w
}

// start runs the ring's caches and workers until stop or ctx is done.
func (r *runner) start(ctx context.Context) {
	ctx, r.cancel = context.WithCancel(ctx)
	ctx = log.IntoContext(ctx, r.logger)
	for _, w := range r.all() {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			w.informer.RunWithContext(ctx)
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
func (r *runner) stop() {
	r.cancel()
	r.queue.ShutDown()
	r.wg.Wait()
	r.c.opts.Registry.SetAssigned(r.name, nil)
}

func (r *runner) all() []*watched {
	all := make([]*watched, 0, len(r.mains)+len(r.controlled)+1)
	all = append(all, r.mains...)
	all = append(all, r.controlled...)
	return append(all, r.namespaces)
}

// run waits for the caches, then starts the workers and answers membership
// changes, configuration changes and resyncs.
func (r *runner) run(ctx context.Context) {
	r.triggerStatus()
	err := wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(context.Context) (bool, error) {
		for _, w := range r.all() {
			if !w.informer.HasSynced() && !w.failed() {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return
	}
	r.unknownUntil = r.c.opts.Clock.Now().Add(2 * membership.DefaultLeaseDuration)
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
			r.enqueueAll()
		}
	}
}

func (r *runner) processNext(ctx context.Context) bool {
	it, quit := r.queue.Get()
	if quit {
		return false
	}
	defer r.queue.Done(it)
	after, err := r.reconcile(ctx, it)
	if err != nil {
		if ctx.Err() == nil {
			if apierrors.IsConflict(err) {
				r.logger.V(1).Info("Object changed meanwhile, deciding again", "kind", it.gk.String(), "namespace", it.namespace, "name", it.name)
			} else {
				r.logger.Error(err, "Cannot assign object", "kind", it.gk.String(), "namespace", it.namespace, "name", it.name)
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
func (r *runner) urgent(it item) bool {
	w := r.byGK[it.gk]
	if w == nil {
		return false
	}
	obj, ok := w.get(it.namespace, it.name)
	if !ok {
		return false
	}
	view, cfg := r.view.Load(), r.cfg.Load()
	if view == nil {
		return obj.Labels[r.shardLabel] == ""
	}
	s, err := r.situation(view, cfg, it.gk, obj)
	return err == nil && decide(s).action.urgent()
}

// notifyMembership asks the runner to rebuild its ring; it never blocks.
func (r *runner) notifyMembership() {
	select {
	case r.membership <- struct{}{}:
	default:
	}
}

// reconfigure applies a new spec that watches the same resources.
func (r *runner) reconfigure(cfg *ringConfig) {
	r.cfg.Store(cfg)
	select {
	case r.reconfig <- struct{}{}:
	default:
	}
	r.triggerStatus()
}

func (r *runner) triggerStatus() {
	select {
	case r.status <- struct{}{}:
	default:
	}
}

func (r *runner) enqueue(gk schema.GroupKind, obj metav1.Object) {
	r.queue.Add(item{gk: gk, namespace: obj.GetNamespace(), name: obj.GetName()})
}

// enqueueAll adds every main object of the ring.
func (r *runner) enqueueAll() {
	for _, w := range r.mains {
		for _, obj := range w.informer.GetStore().List() {
			if m, ok := obj.(*object); ok {
				r.enqueue(w.res.gk, m)
			}
		}
	}
}

// selected reports whether objects of namespace belong to the ring.
// Cluster-scoped objects always do. An unknown namespace does not (yet).
func (r *runner) selected(namespace string) bool {
	if namespace == "" {
		return true
	}
	ns, ok := r.namespaces.getNamespace(namespace)
	if !ok {
		return false
	}
	return r.cfg.Load().selector.Matches(labelsOf(ns))
}

func (r *runner) mainChanged(w *watched, oldObj, newObj any) {
	obj, ok := newObj.(*object)
	if !ok {
		return
	}
	if obj.Labels[r.shardLabel] == "" && r.selected(obj.Namespace) {
		r.seen.LoadOrStore(obj.UID, r.c.opts.Clock.Now())
	}
	if old, ok := oldObj.(*object); ok && !r.labelsChanged(old, obj) {
		return
	}
	r.enqueue(w.res.gk, obj)
	r.triggerStatus()
}

func (r *runner) mainDeleted(obj any) {
	if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	m, ok := obj.(*object)
	if !ok {
		return
	}
	r.seen.Delete(m.UID)
	r.written.Delete(m.UID)
	r.drains.End(m.UID)
	r.triggerStatus()
}

func (r *runner) controlledChanged(w *watched, oldObj, newObj any) {
	obj, ok := newObj.(*object)
	if !ok {
		return
	}
	if old, ok := oldObj.(*object); ok &&
		!r.labelsChanged(old, obj) && controllerUID(old) == controllerUID(obj) {
		return
	}
	if root, ok := r.rootOf(w.res.gk, obj); ok {
		r.queue.Add(root)
	}
}

func (r *runner) namespaceChanged(oldObj, newObj any) {
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
		for _, obj := range w.informer.GetStore().List() {
			if m, ok := obj.(*object); ok && m.Namespace == ns.Name {
				r.enqueue(w.res.gk, m)
			}
		}
	}
	r.triggerStatus()
}

func (r *runner) labelsChanged(a, b *object) bool {
	return a.Labels[r.shardLabel] != b.Labels[r.shardLabel] ||
		drain.Requested(a, r.name) != drain.Requested(b, r.name)
}

// stale reports whether the cache still holds a version of obj older than
// the sharder's last write to it: deciding on it would undo that write.
func (r *runner) stale(obj *object) bool {
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
func (r *runner) noteWrite(uid types.UID, resourceVersion string) {
	if rv, err := strconv.ParseInt(resourceVersion, 10, 64); err == nil {
		r.written.Store(uid, rv)
	}
}
