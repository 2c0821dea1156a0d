package instance

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/instance/internal/slotcache"
)

// ErrModeMismatch is wrapped by the errors of Setup and of Instance.Start
// that refuse a manager whose cache does not fit the ring's unit: a ring of
// unit Slots with a cache NewCache did not make for it, or a slot cache for
// a ring of unit Objects, of another slot count or of another ring (the
// ring was deleted and created again between the manager's creation and
// the instance's start).
var ErrModeMismatch = errors.New("the manager's cache does not fit the ring's assignment unit")

// ErrShardedListAndWatch is wrapped by the errors that refuse
// Options.ShardedListAndWatch for a ring whose slots are not keyed by
// namespace, or for a ring of unit Objects: when the manager is created,
// at Setup or at start.
var ErrShardedListAndWatch = errors.New("sharded list and watch needs a ring whose slots are keyed by namespace")

// ringReadTimeout bounds each read of the ring.
const ringReadTimeout = 10 * time.Second

// NewCache returns the manager.Options.NewCache of an instance of
// opts.Ring, for either assignment unit: it reads the ring from the API
// server when the manager is created and makes the cache the ring's unit
// needs for the ring's resources objects (one empty object of each of the
// ring's main and controlled resources the instance reads or watches, e.g.
// &corev1.ConfigMap{}), with the manager's cache options
// (manager.Options.Cache):
//
//   - a ring of unit Objects: the manager's cache, its entries for objects
//     restricted to the instance's shard label (Selector, ANDed with a
//     label selector an entry of the manager's options already has);
//   - a ring of unit Slots (docs/design.md §11): a cache of the slots the
//     instance holds, one watch per group of slots, which follows the
//     sharder's slot table once Setup's instance holds its Lease.
//
// Pass the same Options to NewCache and Setup:
//
//	opts := instance.Options{Ring: "my-ring", Lease: leaseholder.Options{Namespace: "my-system"}}
//	mgr, _ := ctrl.NewManager(cfg, ctrl.Options{NewCache: instance.NewCache(opts, &corev1.ConfigMap{})})
//	inst, _ := instance.Setup(mgr, opts)
//
// A ring that does not exist yet, or that the instance may not read (an
// instance in object mode needs no permission on ControllerRings), gives
// the cache of unit Objects, as does an API server that does not serve
// ControllerRings: the reason is logged. Any other failure to read the ring
// fails the manager's creation, as does Options.ShardedListAndWatch on a
// ring that is not of unit Slots keyed by namespace, or that cannot be read
// (ErrShardedListAndWatch).
func NewCache(opts Options, objects ...client.Object) cache.NewCacheFunc {
	return func(cfg *rest.Config, cacheOpts cache.Options) (cache.Cache, error) {
		if err := opts.setDefaults(); err != nil {
			return nil, err
		}
		ring, err := readRingOnce(cfg, cacheOpts.HTTPClient, opts.Ring)
		switch {
		case err != nil && opts.ShardedListAndWatch:
			return nil, fmt.Errorf("cache of ring %q: %w: reading the ring: %w", opts.Ring, ErrShardedListAndWatch, err)
		case apierrors.IsNotFound(err), apierrors.IsForbidden(err), apimeta.IsNoMatchError(err), discovery.IsGroupDiscoveryFailedError(err):
			logf.Log.WithName("instance").Info("Cannot read the ring: running in object mode", "ring", opts.Ring, "reason", err.Error())
			return newObjectCache(cfg, cacheOpts, opts, objects, false)
		case err != nil:
			return nil, fmt.Errorf("cache of ring %q: reading the ring: %w", opts.Ring, err)
		case !ring.Spec.AssignsSlots():
			if opts.ShardedListAndWatch {
				return nil, fmt.Errorf("cache of ring %q: %w: the ring assigns %s, not Slots", opts.Ring, ErrShardedListAndWatch, unitOf(&ring.Spec))
			}
			return newObjectCache(cfg, cacheOpts, opts, objects, true)
		}
		var sharded []client.Object
		if opts.ShardedListAndWatch {
			if key := ring.Spec.EffectiveSlotKey(); key != v1alpha1.SlotKeyNamespace {
				return nil, fmt.Errorf("cache of ring %q: %w", opts.Ring, errShardedKey(opts.Ring, key))
			}
			if sharded, err = shardedObjects(cfg, cacheOpts, &ring.Spec, objects); err != nil {
				return nil, fmt.Errorf("cache of ring %q: %w", opts.Ring, err)
			}
		}
		return slotcache.New(cfg, slotcache.Options{Ring: opts.Ring, Count: ring.Spec.EffectiveSlotCount(), Objects: objects, Cache: cacheOpts, Sharded: sharded, FromRing: true})
	}
}

// objectCache is the cache NewCache makes for a ring of unit Objects: the
// manager's cache with the instance's selector. checked records that the
// ring was read and found of unit Objects, so that Setup need not read it
// again.
type objectCache struct {
	cache.Cache
	ring    string
	checked bool
}

// newObjectCache makes the cache of an instance in object mode: cacheOpts
// with the instance's selector on objects' entries.
func newObjectCache(cfg *rest.Config, cacheOpts cache.Options, opts Options, objects []client.Object, checked bool) (cache.Cache, error) {
	byObject, err := selectByShard(cacheOpts, opts.Ring, opts.Identity, objects)
	if err != nil {
		return nil, fmt.Errorf("cache of ring %q: %w", opts.Ring, err)
	}
	cacheOpts.ByObject = byObject
	c, err := cache.New(cfg, cacheOpts)
	if err != nil {
		return nil, err
	}
	return &objectCache{Cache: c, ring: opts.Ring, checked: checked}, nil
}

// selectByShard returns cacheOpts.ByObject with the instance's selector on
// the entry of each of objects' kinds: an entry the options have for the
// kind keeps its settings, its label selector ANDed with the instance's.
func selectByShard(cacheOpts cache.Options, ring, identity string, objects []client.Object) (map[client.Object]cache.ByObject, error) {
	scheme := cacheOpts.Scheme
	if scheme == nil {
		scheme = clientgoscheme.Scheme
	}
	byGVK := map[schema.GroupVersionKind]client.Object{}
	out := make(map[client.Object]cache.ByObject, len(cacheOpts.ByObject)+len(objects))
	for obj, entry := range cacheOpts.ByObject {
		gvk, err := apiutil.GVKForObject(obj, scheme)
		if err != nil {
			return nil, fmt.Errorf("cache entry %T: %w", obj, err)
		}
		byGVK[gvk] = obj
		out[obj] = entry
	}
	selector := Selector(ring, identity)
	for _, obj := range objects {
		gvk, err := apiutil.GVKForObject(obj, scheme)
		if err != nil {
			return nil, fmt.Errorf("ring resource %T: %w", obj, err)
		}
		key, ok := byGVK[gvk]
		if !ok {
			out[obj] = cache.ByObject{Label: selector}
			byGVK[gvk] = obj
			continue
		}
		entry := out[key]
		if entry.Label == nil {
			entry.Label = selector
		} else {
			reqs, _ := selector.Requirements()
			entry.Label = entry.Label.Add(reqs...)
		}
		out[key] = entry
	}
	return out, nil
}

// readRingOnce reads ring with a client of its own, never from a cache.
func readRingOnce(cfg *rest.Config, hc *http.Client, name string) (*v1alpha1.ControllerRing, error) {
	c, err := newRingClient(cfg, hc)
	if err != nil {
		return nil, err
	}
	return readRing(context.Background(), c, name)
}

// readRing reads ring from the API server with c.
func readRing(ctx context.Context, c client.Reader, name string) (*v1alpha1.ControllerRing, error) {
	ctx, cancel := context.WithTimeout(ctx, ringReadTimeout)
	defer cancel()
	r := &v1alpha1.ControllerRing{}
	if err := c.Get(ctx, client.ObjectKey{Name: name}, r); err != nil {
		return nil, err
	}
	return r, nil
}

func errShardedKey(ring, key string) error {
	return fmt.Errorf("%w: ring %q has spec.assignment.slots.key %s, whose slots are not ranges of the namespace's hash; "+
		"create the ring with spec.assignment.slots.key: Namespace (fixed at creation), or turn ShardedListAndWatch off",
		ErrShardedListAndWatch, ring, key)
}

// shardedObjects returns the objects whose resources an instance selects by
// shard on a ring of key Namespace: the ring's main and controlled
// resources when every main resource is namespaced (as the API server's
// discovery says; a main resource it does not know counts as
// cluster-scoped), its main resources alone when it has no controlled
// ones, and none otherwise: the children of a cluster-scoped controller
// carry its slot by label only, so a main object watched by shard could be
// seen before its children, which are seen only once labelled.
func shardedObjects(cfg *rest.Config, opts cache.Options, spec *v1alpha1.ControllerRingSpec, objects []client.Object) ([]client.Object, error) {
	scheme, mapper := opts.Scheme, opts.Mapper
	if scheme == nil {
		scheme = clientgoscheme.Scheme
	}
	if mapper == nil {
		hc := opts.HTTPClient
		if hc == nil {
			var err error
			if hc, err = rest.HTTPClientFor(cfg); err != nil {
				return nil, fmt.Errorf("HTTP client: %w", err)
			}
		}
		var err error
		if mapper, err = apiutil.NewDynamicRESTMapper(cfg, hc); err != nil {
			return nil, fmt.Errorf("REST mapper: %w", err)
		}
	}
	mainsNamespaced := true
	for _, r := range spec.Resources {
		gvk, err := mapper.KindFor(schema.GroupVersionResource{Group: r.Group, Resource: r.Resource})
		if err != nil {
			mainsNamespaced = false
			break
		}
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil || m.Scope.Name() != apimeta.RESTScopeNameNamespace {
			mainsNamespaced = false
			break
		}
	}
	var out []client.Object
	for _, obj := range objects {
		gvk, err := apiutil.GVKForObject(obj, scheme)
		if err != nil {
			return nil, fmt.Errorf("ring resource %T: %w", obj, err)
		}
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return nil, fmt.Errorf("ring resource %s: %w", gvk.GroupKind(), err)
		}
		gr := m.Resource.GroupResource()
		if (spec.IsMainResource(gr) && (mainsNamespaced || len(spec.ControlledResources()) == 0)) ||
			(mainsNamespaced && slices.Contains(spec.ControlledResources(), gr)) {
			out = append(out, obj)
		}
	}
	return out, nil
}

// ringScheme knows the ControllerRing alone: the instance reads its ring
// whatever the manager's scheme holds.
var ringScheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}()

// newRingClient returns a direct client (no cache) for ControllerRings.
func newRingClient(cfg *rest.Config, hc *http.Client) (client.WithWatch, error) {
	c, err := client.NewWithWatch(cfg, client.Options{HTTPClient: hc, Scheme: ringScheme})
	if err != nil {
		return nil, fmt.Errorf("creating the ring's client: %w", err)
	}
	return c, nil
}

func unitOf(spec *v1alpha1.ControllerRingSpec) string {
	if spec.Assignment == nil || spec.Assignment.Unit == "" {
		return v1alpha1.AssignmentUnitObjects
	}
	return spec.Assignment.Unit
}

// checkMode returns an error wrapping ErrModeMismatch when ring's unit does
// not fit the manager's cache: sc is the slot cache, nil for another cache.
func checkMode(ring *v1alpha1.ControllerRing, sc *slotcache.Cache) error {
	switch slotsRing := ring.Spec.AssignsSlots(); {
	case slotsRing && sc == nil:
		return fmt.Errorf("%w: ring %q assigns Slots, but the manager's cache is not a slot cache: create the manager with NewCache: instance.NewCache(opts, <the ring's resources>...)",
			ErrModeMismatch, ring.Name)
	case !slotsRing && sc != nil:
		return fmt.Errorf("%w: ring %q assigns %s, but the manager's cache is a slot cache: create the manager with NewCache: instance.NewCache(opts, <the ring's resources>...)",
			ErrModeMismatch, ring.Name, unitOf(&ring.Spec))
	case slotsRing && sc.Count() != ring.Spec.EffectiveSlotCount():
		return fmt.Errorf("%w: ring %q has %d slots, but the manager's slot cache was created for %d",
			ErrModeMismatch, ring.Name, ring.Spec.EffectiveSlotCount(), sc.Count())
	case slotsRing && len(sc.Sharded()) > 0 && ring.Spec.EffectiveSlotKey() != v1alpha1.SlotKeyNamespace:
		return errShardedKey(ring.Name, ring.Spec.EffectiveSlotKey())
	}
	return nil
}
