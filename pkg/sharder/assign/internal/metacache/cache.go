package metacache

import (
	"context"
	"fmt"
	"iter"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/metadata"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// indexController maps an object to the UID of its controller.
const indexController = "controller"

// Cache is the metadata cache of one resource of a ring: a metadata-only
// informer over every namespace, or one per namespace of a bounded set
// (Options.Namespaces), keeping what its transform leaves of each object,
// and what keeps the sharder from using the resource (a list or watch the
// API server refuses, a patch it forbids).
type Cache struct {
	resource schema.GroupResource
	// informers holds one informer over every namespace, or one per
	// namespace of Options.Namespaces, in its order.
	informers []toolscache.SharedIndexInformer
	// byNamespace maps a namespace to its informer; nil when one informer
	// watches every namespace.
	byNamespace map[string]toolscache.SharedIndexInformer
	handlers    []toolscache.ResourceEventHandlerRegistration

	mu        sync.Mutex
	watchErrs []error // per informer, the last list or watch error; cleared by a list or watch the API server accepts
	patchErr  error   // last Forbidden answer to a patch; cleared by a successful patch
}

// Options configures a Cache.
type Options struct {
	// IndexByController lets ByController find objects by their
	// controller's UID. Every index costs memory per object: only the
	// controlled resources of a ring need it. Default: false.
	IndexByController bool

	// OnWatchChange is called with the resource and the error after the
	// Cache recorded a failed list or watch, and with a nil error after the
	// first list or watch the API server accepts again, from the informer's
	// goroutine. Default: nothing.
	OnWatchChange func(schema.GroupVersionResource, error)

	// Namespaces, when not empty, limits the cache to these namespaces of a
	// namespaced resource: one list and watch each instead of one over the
	// cluster, so objects of other namespaces cost no memory and the
	// sharder needs no permission outside them. Default: every namespace.
	Namespaces []string

	// LabelSelector, when not empty, lists and watches only the objects it
	// selects: an object whose labels stop matching leaves the cache (a
	// delete event), one that starts matching enters it. The slot labeler
	// watches only objects still without a slot label
	// ("!slot.sharder.dev/<ring>"). Default: every object.
	LabelSelector string
}

// NewObjects returns the cache of resource gvr, keeping Objects made by
// transform (the ring's, shared by all its caches). It watches nothing
// until Run.
func NewObjects(client metadata.Interface, gvr schema.GroupVersionResource, transform *ObjectTransform, opts Options) *Cache {
	indexers := toolscache.Indexers{}
	if opts.IndexByController {
		indexers[indexController] = indexByController
	}
	return newCache(client, gvr, indexers, transform.Transform, opts.OnWatchChange, opts.Namespaces, opts.LabelSelector)
}

// NewNamespaces returns the cache of Namespaces, keeping their names and
// labels for a ring's namespaceSelector (see GetNamespace). It watches
// nothing until Run.
func NewNamespaces(client metadata.Interface, onWatchChange func(schema.GroupVersionResource, error)) *Cache {
	gvr := schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}
	return newCache(client, gvr, toolscache.Indexers{}, transformNamespace, onWatchChange, nil, "")
}

func newCache(client metadata.Interface, gvr schema.GroupVersionResource, indexers toolscache.Indexers,
	transform toolscache.TransformFunc, onWatchChange func(schema.GroupVersionResource, error), namespaces []string, labelSelector string) *Cache {
	c := &Cache{resource: gvr.GroupResource()}
	if len(namespaces) == 0 {
		namespaces = []string{metav1.NamespaceAll}
	} else {
		c.byNamespace = make(map[string]toolscache.SharedIndexInformer, len(namespaces))
	}
	c.watchErrs = make([]error, len(namespaces))
	for i, ns := range namespaces {
		inf := newInformer(client, gvr, ns, labelSelector, indexers, transform, func(err error) {
			c.mu.Lock()
			changed := c.watchErrs[i] != nil || err != nil
			c.watchErrs[i] = err
			c.mu.Unlock()
			if changed && onWatchChange != nil {
				onWatchChange(gvr, err)
			}
		})
		c.informers = append(c.informers, inf)
		if c.byNamespace != nil {
			c.byNamespace[ns] = inf
		}
	}
	return c
}

// newInformer returns the informer of gvr in namespace (all when empty),
// of the objects labelSelector selects (all when empty), reporting every
// list or watch error, and the first success after one, to note.
func newInformer(client metadata.Interface, gvr schema.GroupVersionResource, namespace, labelSelector string, indexers toolscache.Indexers,
	transform toolscache.TransformFunc, note func(error)) toolscache.SharedIndexInformer {
	// The informer of metadatainformer, with a list and watch that report
	// their success: the reflector reports only failures, and a resource
	// that fails after its first sync must be reported until it recovers.
	resources := client.Resource(gvr).Namespace(namespace)
	lw := &toolscache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			if labelSelector != "" {
				opts.LabelSelector = labelSelector
			}
			list, err := resources.List(ctx, opts)
			if err == nil {
				note(nil)
			}
			return list, err
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			if labelSelector != "" {
				opts.LabelSelector = labelSelector
			}
			w, err := resources.Watch(ctx, opts)
			if err == nil {
				note(nil)
			}
			return w, err
		},
	}
	inf := toolscache.NewSharedIndexInformer(toolscache.ToListWatcherWithWatchListSemantics(lw, client),
		&metav1.PartialObjectMetadata{}, 0, indexers)
	// Errors only come from calls made after the informer started; none is made yet.
	_ = inf.SetTransform(transform)
	_ = inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *toolscache.Reflector, err error) { note(err) })
	return inf
}

// AddEventHandler adds handler to the informers. Handlers are called one at
// a time per namespace watched, in the order of its events (one namespace's
// events may interleave with another's); add them before Run.
func (c *Cache) AddEventHandler(handler toolscache.ResourceEventHandler) {
	for _, inf := range c.informers {
		// An error only comes from an informer that was stopped.
		if reg, err := inf.AddEventHandler(handler); err == nil {
			c.handlers = append(c.handlers, reg)
		}
	}
}

// Run lists and watches the resource until ctx is done.
func (c *Cache) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, inf := range c.informers {
		wg.Go(func() { inf.RunWithContext(ctx) })
	}
	wg.Wait()
}

// HasSynced reports whether the cache holds every object of its first
// lists and its handlers have been called for each of them.
func (c *Cache) HasSynced() bool {
	for _, inf := range c.informers {
		if !inf.HasSynced() {
			return false
		}
	}
	for _, reg := range c.handlers {
		if !reg.HasSynced() {
			return false
		}
	}
	return true
}

// Get returns the object namespace/name (namespace empty for a
// cluster-scoped resource).
func (c *Cache) Get(namespace, name string) (*Object, bool) {
	obj, ok := c.get(namespace, name)
	m, isObject := obj.(*Object)
	return m, ok && isObject
}

// GetNamespace returns a Namespace of a cache made by NewNamespaces.
func (c *Cache) GetNamespace(name string) (*metav1.PartialObjectMetadata, bool) {
	obj, ok := c.get("", name)
	m, isNamespace := obj.(*metav1.PartialObjectMetadata)
	return m, ok && isNamespace
}

func (c *Cache) get(namespace, name string) (any, bool) {
	key := name
	if namespace != "" {
		key = namespace + "/" + name
	}
	inf := c.informers[0]
	if c.byNamespace != nil {
		if inf = c.byNamespace[namespace]; inf == nil {
			return nil, false // a namespace the cache does not watch
		}
	}
	obj, ok, err := inf.GetIndexer().GetByKey(key)
	if err != nil || !ok {
		return nil, false
	}
	return obj, true
}

// List yields every object of the cache, in no particular order.
func (c *Cache) List() iter.Seq[*Object] {
	return func(yield func(*Object) bool) {
		for _, inf := range c.informers {
			for _, obj := range inf.GetStore().List() {
				if m, ok := obj.(*Object); ok && !yield(m) {
					return
				}
			}
		}
	}
}

// ByController yields the objects whose controller has uid. It yields
// nothing unless the cache was made with Options.IndexByController.
func (c *Cache) ByController(uid types.UID) iter.Seq[*Object] {
	return func(yield func(*Object) bool) {
		for _, inf := range c.informers {
			objs, err := inf.GetIndexer().ByIndex(indexController, string(uid))
			if err != nil {
				return
			}
			for _, obj := range objs {
				if m, ok := obj.(*Object); ok && !yield(m) {
					return
				}
			}
		}
	}
}

// NotePatch records the outcome of a patch of one of the cache's objects: a
// Forbidden answer becomes a problem of the resource until a patch
// succeeds. It reports whether Problem may have changed.
func (c *Cache) NotePatch(err error) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case err == nil:
		if c.patchErr == nil {
			return false
		}
		c.patchErr = nil
		return true
	case apierrors.IsForbidden(err):
		c.patchErr = err
		return true
	}
	return false
}

// Problem is a resource of a ring the sharder cannot use, as the ring's
// Ready condition reports it.
type Problem struct {
	Resource schema.GroupResource
	Reason   string // v1alpha1.ReasonResourceNotServed or ReasonResourceForbidden
	Message  string
}

// NotServed is the problem of a resource the API server does not serve.
func NotServed(gr schema.GroupResource, err error) *Problem {
	return &Problem{Resource: gr, Reason: v1alpha1.ReasonResourceNotServed, Message: fmt.Sprintf(
		"resource %q is not served by the API server (%v): install its CustomResourceDefinition or correct spec.resources", gr.String(), err)}
}

// Problem returns what keeps the sharder from using the resource, nil when
// nothing does. A list or watch refused after the first sync is a problem
// as well: the cache keeps the objects it had but misses every change until
// the API server accepts a list or watch again.
func (c *Cache) Problem() *Problem {
	c.mu.Lock()
	watchErr, patchErr := c.firstWatchErr(), c.patchErr
	c.mu.Unlock()
	gr := c.resource
	switch {
	case patchErr != nil:
		return &Problem{Resource: gr, Reason: v1alpha1.ReasonResourceForbidden, Message: fmt.Sprintf(
			"the sharder may not patch %q (%v): grant its ServiceAccount patch on this resource", gr.String(), patchErr)}
	case watchErr == nil:
		return nil
	case apierrors.IsForbidden(watchErr):
		return &Problem{Resource: gr, Reason: v1alpha1.ReasonResourceForbidden, Message: fmt.Sprintf(
			"the sharder may not list and watch %q (%v): grant its ServiceAccount get, list, watch and patch on this resource", gr.String(), watchErr)}
	case apierrors.IsNotFound(watchErr):
		return NotServed(gr, watchErr)
	default:
		return nil // transient: still syncing
	}
}

// firstWatchErr returns the watch error that matters most: a refusal
// (Forbidden, then NotFound) before a transient error, nil when every list
// and watch is accepted. The caller holds mu.
func (c *Cache) firstWatchErr() error {
	var transient, notFound error
	for _, err := range c.watchErrs {
		switch {
		case err == nil:
		case apierrors.IsForbidden(err):
			return err
		case apierrors.IsNotFound(err):
			notFound = err
		default:
			transient = err
		}
	}
	if notFound != nil {
		return notFound
	}
	return transient
}

// Failed reports whether the cache cannot sync: nobody should wait for it.
func (c *Cache) Failed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	err := c.firstWatchErr()
	return err != nil && (apierrors.IsForbidden(err) || apierrors.IsNotFound(err))
}
