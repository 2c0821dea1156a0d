package slotlabel

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/metadata"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/sharder/assign/internal/metacache"
)

// Defaults of Options.
const (
	DefaultWorkers      = 8
	DefaultResyncPeriod = 5 * time.Minute
	DefaultRecheck      = 30 * time.Second
)

// Retry delays of an object whose write failed.
const (
	retryBaseDelay = 5 * time.Millisecond
	retryMaxDelay  = time.Minute
)

// Options configures a Labeler.
type Options struct {
	// Ring is the ring whose objects are labelled; it must be of unit
	// Slots. New reads its name, resources, namespaceSelector and slots,
	// and keeps a copy. Required.
	Ring *v1alpha1.ControllerRing

	// Client lists, watches and gets the metadata of the ring's resources
	// (and of Namespaces). Give it the assignment's high QPS and burst
	// (assign.Options.QPS): client-go's defaults would hold the writes of a
	// ring created over many objects to a few per second. Required.
	Client metadata.Interface

	// Writer patches the slot labels; give it a request timeout, as the
	// assignment's label writes have (assign.Options.WriteTimeout), so that
	// a write does not land long after it was decided. Default: Client.
	Writer metadata.Interface

	// Mapper resolves the ring's resources to their versions, kinds and
	// scopes. A resource it does not know is not watched and is reported by
	// Problems; the ring's other resources are labelled. Required.
	Mapper meta.RESTMapper

	// Namespaces, when not empty, are the only namespaces the ring's
	// namespaced resources are watched in (one list and watch each): the
	// namespaces its namespaceSelector names, as the assignment computes
	// them for a ring of named namespaces. The namespaceSelector still
	// decides which objects are labelled. Default: every namespace.
	Namespaces []string

	// Workers is the number of objects labelled concurrently. Default: 8.
	Workers int

	// FieldManager names the sharder in its label writes. Default: "".
	FieldManager string

	// Recorder, when set, records a warning event on each object the
	// labeler leaves without a slot for a reason its owner may want to
	// know (a controller gone, not of the ring, or with an invalid slot).
	// Default: logs only.
	Recorder record.EventRecorder

	// ResyncPeriod is how often every object still in the caches is looked
	// at again, to heal what a missed event left. Default: 5m.
	ResyncPeriod time.Duration

	// Recheck is when an object is looked at again whose slot comes from
	// an object of a namespace the caches have not seen yet, should the
	// namespace's arrival, which queues its objects, have come first.
	// Default: 30s.
	Recheck time.Duration

	// Logger logs what the labeler does. Default: controller-runtime's
	// logger named "slotlabel", with the ring.
	Logger logr.Logger
}

// resource is a resource of the ring with its cache.
type resource struct {
	gvr        schema.GroupVersionResource
	gvk        schema.GroupVersionKind
	namespaced bool
	main       bool
	cache      *metacache.Cache
}

// item is a work item: an object of a resource of the ring.
type item struct {
	res       *resource
	namespace string
	name      string
}

// Labeler writes the slot label of every object of one ring of unit
// Slots. Build it with New and run it with Start; it is a
// manager.LeaderElectionRunnable that runs on the leader only.
type Labeler struct {
	opts      Options
	ring      string
	spec      *v1alpha1.ControllerRingSpec
	count     int
	slotLabel string
	selector  labels.Selector
	logger    logr.Logger

	byGK       map[schema.GroupKind]*resource
	mains      []*resource
	controlled []*resource
	namespaces *metacache.Cache
	unresolved []metacache.Problem

	queue workqueue.TypedRateLimitingInterface[item]
	// written maps the UID of an object the labeler labelled to the
	// resourceVersion its write produced, until the object leaves the
	// caches: a cached version older than that is not decided again.
	written sync.Map
	// reported maps the UID of an object left without a slot to the reason
	// reported, so that each reason is reported once per object.
	reported sync.Map
	synced   atomic.Bool
	started  atomic.Bool
}

var _ manager.LeaderElectionRunnable = &Labeler{}

// New returns the Labeler of opts.Ring. It watches nothing until Start.
func New(opts Options) (*Labeler, error) {
	switch {
	case opts.Ring == nil:
		return nil, errors.New("no Ring")
	case !opts.Ring.Spec.AssignsSlots():
		return nil, fmt.Errorf("ring %q is not of unit %s", opts.Ring.Name, v1alpha1.AssignmentUnitSlots)
	case opts.Client == nil:
		return nil, errors.New("no Client")
	case opts.Mapper == nil:
		return nil, errors.New("no Mapper")
	}
	sel, err := opts.Ring.Spec.NamespaceLabelSelector()
	if err != nil {
		return nil, err
	}
	if opts.Writer == nil {
		opts.Writer = opts.Client
	}
	if opts.Workers <= 0 {
		opts.Workers = DefaultWorkers
	}
	if opts.ResyncPeriod <= 0 {
		opts.ResyncPeriod = DefaultResyncPeriod
	}
	if opts.Recheck <= 0 {
		opts.Recheck = DefaultRecheck
	}
	spec := opts.Ring.Spec.DeepCopy()
	l := &Labeler{
		opts:      opts,
		ring:      opts.Ring.Name,
		spec:      spec,
		count:     spec.EffectiveSlotCount(),
		slotLabel: v1alpha1.SlotLabel(opts.Ring.Name),
		selector:  sel,
		byGK:      map[schema.GroupKind]*resource{},
	}
	if !opts.Logger.IsZero() {
		l.logger = opts.Logger
	} else {
		l.logger = logf.Log.WithName("slotlabel").WithValues("ring", l.ring)
	}
	l.queue = workqueue.NewTypedRateLimitingQueue(
		workqueue.NewTypedItemExponentialFailureRateLimiter[item](retryBaseDelay, retryMaxDelay))

	// Only objects without the ring's slot label are watched.
	unlabelled, err := labels.NewRequirement(l.slotLabel, selection.DoesNotExist, nil)
	if err != nil {
		return nil, fmt.Errorf("slot label of ring %q: %w", l.ring, err)
	}
	transform := metacache.NewObjectTransform(l.ring)
	add := func(gr schema.GroupResource, main bool) {
		res, problem := resolve(opts.Mapper, gr)
		if problem != nil {
			l.unresolved = append(l.unresolved, *problem)
			l.logger.Info("Resource of the ring is not served: not labelled", "resource", gr.String(), "error", problem.Message)
			return
		}
		if _, dup := l.byGK[res.gvk.GroupKind()]; dup {
			return // listed as main and controlled: main (as owners.Resolver counts it)
		}
		res.main = main
		copts := metacache.Options{
			IndexByController: !main,
			LabelSelector:     labels.NewSelector().Add(*unlabelled).String(),
			OnWatchChange:     l.watchChanged,
		}
		if res.namespaced {
			copts.Namespaces = opts.Namespaces
		}
		res.cache = metacache.NewObjects(opts.Client, res.gvr, transform, copts)
		l.addHandlers(res)
		l.byGK[res.gvk.GroupKind()] = res
		if main {
			l.mains = append(l.mains, res)
		} else {
			l.controlled = append(l.controlled, res)
		}
	}
	for _, gr := range spec.MainResources() {
		add(gr, true)
	}
	for _, gr := range spec.ControlledResources() {
		add(gr, false)
	}
	l.namespaces = metacache.NewNamespaces(opts.Client, l.watchChanged)
	l.namespaces.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { l.namespaceChanged(nil, obj) },
		UpdateFunc: l.namespaceChanged,
	})
	return l, nil
}

// resolve finds the version, kind and scope of gr.
func resolve(mapper meta.RESTMapper, gr schema.GroupResource) (*resource, *metacache.Problem) {
	gvk, err := mapper.KindFor(gr.WithVersion(""))
	if err == nil {
		var mapping *meta.RESTMapping
		if mapping, err = mapper.RESTMapping(gvk.GroupKind(), gvk.Version); err == nil {
			return &resource{
				gvr:        mapping.Resource,
				gvk:        mapping.GroupVersionKind,
				namespaced: mapping.Scope.Name() == meta.RESTScopeNameNamespace,
			}, nil
		}
	}
	return nil, metacache.NotServed(gr, err)
}

// NeedLeaderElection reports true: only the leading sharder writes labels.
func (l *Labeler) NeedLeaderElection() bool { return true }

// Start runs the caches and, once they have synced, the workers, until ctx
// is done; it returns when every goroutine it started has returned. A
// Labeler starts once.
func (l *Labeler) Start(ctx context.Context) error {
	if !l.started.CompareAndSwap(false, true) {
		return errors.New("slot labeler already started")
	}
	ctx, cancel := context.WithCancel(ctx)
	ctx = logf.IntoContext(ctx, l.logger)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		l.queue.ShutDown()
		wg.Wait()
	}()
	for _, c := range l.caches() {
		wg.Go(func() { c.Run(ctx) })
	}

	// A cache that cannot sync (its resource not served, or forbidden) is
	// not waited for: the other resources are labelled, and Problems says
	// why that one is not.
	err := wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(context.Context) (bool, error) {
		for _, c := range l.caches() {
			if !c.HasSynced() && !c.Failed() {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return nil // stopped before the caches synced
	}
	l.synced.Store(true)
	l.logger.Info("Caches synced", "unlabelled", l.Unlabelled())
	l.enqueueAll()

	for range l.opts.Workers {
		wg.Go(func() {
			for l.processNext(ctx) {
			}
		})
	}
	resync := time.NewTicker(l.opts.ResyncPeriod)
	defer resync.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-resync.C:
			l.enqueueAll()
		}
	}
}

// HasSynced reports whether the caches have synced and the labeler works.
func (l *Labeler) HasSynced() bool { return l.synced.Load() }

// Unlabelled counts the objects of the ring's resources in the namespaces
// it selects that are still without a slot label, as far as the caches
// know: objects waiting for their write or their controller's, and
// controlled objects left without a slot (status.unassignedObjects).
func (l *Labeler) Unlabelled() int {
	n := 0
	selected := map[string]bool{}
	for _, res := range l.all() {
		for obj := range res.cache.List() {
			sel, ok := selected[obj.Namespace]
			if !ok {
				sel = l.selected(obj.Namespace)
				selected[obj.Namespace] = sel
			}
			if sel {
				n++
			}
		}
	}
	return n
}

// Problems returns what keeps the labeler from labelling a resource of the
// ring: a resource not served, or one the sharder may not list, watch or
// patch. Empty when every resource is labelled.
func (l *Labeler) Problems() []metacache.Problem {
	out := append([]metacache.Problem(nil), l.unresolved...)
	for _, c := range l.caches() {
		if p := c.Problem(); p != nil {
			out = append(out, *p)
		}
	}
	return out
}

// all returns the ring's resources, main first.
func (l *Labeler) all() []*resource {
	return append(append(make([]*resource, 0, len(l.mains)+len(l.controlled)), l.mains...), l.controlled...)
}

// caches returns every cache of the labeler.
func (l *Labeler) caches() []*metacache.Cache {
	all := l.all()
	out := make([]*metacache.Cache, 0, 1+len(all))
	out = append(out, l.namespaces)
	for _, res := range all {
		out = append(out, res.cache)
	}
	return out
}

func (l *Labeler) watchChanged(gvr schema.GroupVersionResource, err error) {
	switch {
	case err == nil:
		l.logger.Info("Resource is listed and watched again", "resource", gvr.String())
	case !errors.Is(err, context.Canceled):
		l.logger.Info("Cannot list or watch resource", "resource", gvr.String(), "error", err.Error())
	}
}

// addHandlers queues the objects of res as the caches see them change.
// Before the caches have synced nothing is queued: the pass after the sync
// queues every object.
func (l *Labeler) addHandlers(res *resource) {
	res.cache.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if m, ok := obj.(*metacache.Object); ok && l.synced.Load() {
				l.enqueue(res, m)
			}
		},
		UpdateFunc: func(oldObj, newObj any) {
			old, ok1 := oldObj.(*metacache.Object)
			m, ok2 := newObj.(*metacache.Object)
			if !ok1 || !ok2 || !l.synced.Load() {
				return
			}
			// Nothing else the labeler reads can change: a label set
			// makes the object leave the cache.
			if old.ControllerUID() != m.ControllerUID() || (old.DeletionTimestamp == nil) != (m.DeletionTimestamp == nil) {
				l.enqueue(res, m)
			}
		},
		DeleteFunc: func(obj any) {
			if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			m, ok := obj.(*metacache.Object)
			if !ok {
				return
			}
			// Labelled or deleted: either way it is done with, and its
			// controlled objects waiting for it are looked at again.
			l.written.Delete(m.UID)
			l.reported.Delete(m.UID)
			l.wakeChildren(m.UID)
		},
	})
}

// wakeChildren queues the cached objects controlled by uid.
func (l *Labeler) wakeChildren(uid types.UID) {
	if !l.synced.Load() || uid == "" {
		return
	}
	for _, res := range l.controlled {
		for child := range res.cache.ByController(uid) {
			l.enqueue(res, child)
		}
	}
}

func (l *Labeler) namespaceChanged(oldObj, newObj any) {
	ns, ok := newObj.(*metav1.PartialObjectMetadata)
	if !ok || !l.synced.Load() {
		return
	}
	if old, ok := oldObj.(*metav1.PartialObjectMetadata); ok && labels.Equals(old.Labels, ns.Labels) {
		return
	}
	if !l.selector.Matches(labels.Set(ns.Labels)) {
		return // objects already labelled keep their slot; the others wait
	}
	for _, res := range l.all() {
		if !res.namespaced {
			continue
		}
		for obj := range res.cache.List() {
			if obj.Namespace == ns.Name {
				l.enqueue(res, obj)
			}
		}
	}
}

func (l *Labeler) enqueue(res *resource, obj metav1.Object) {
	l.queue.Add(item{res: res, namespace: obj.GetNamespace(), name: obj.GetName()})
}

// enqueueAll queues every cached object.
func (l *Labeler) enqueueAll() {
	for _, res := range l.all() {
		for obj := range res.cache.List() {
			l.enqueue(res, obj)
		}
	}
}

// selected reports whether objects of namespace belong to the ring.
// Cluster-scoped objects always do; a namespace not seen yet does not.
func (l *Labeler) selected(namespace string) bool {
	if namespace == "" {
		return true
	}
	ns, ok := l.namespaces.GetNamespace(namespace)
	return ok && l.selector.Matches(labels.Set(ns.Labels))
}
