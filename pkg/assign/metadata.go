package assign

import (
	"maps"
	"strings"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sharder-dev/sharder/pkg/assign/internal/owners"
)

// transformObject keeps only what assignment needs of an object of the
// ring: name, namespace, uid, resourceVersion, the ring's shard and drain
// labels and the controller ownerReference. It is idempotent and copies
// nothing it drops.
//
// The kept namespace, ownerReference apiVersion and kind, and the label map
// itself are shared between cached objects through r.shared: most objects
// of a ring carry one of a handful of label sets (one per instance). Cached
// objects are never mutated, so sharing is safe.
func (r *runner) transformObject(obj any) (any, error) {
	m, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return obj, nil
	}
	out := &object{
		Name:            m.Name,
		Namespace:       r.shared.str(m.Namespace),
		UID:             m.UID,
		ResourceVersion: m.ResourceVersion,
	}
	shard, hasShard := m.Labels[r.shardLabel]
	drainValue, hasDrain := m.Labels[r.drainLabel]
	out.Labels = r.shared.labels(r.shardLabel, shard, hasShard, r.drainLabel, drainValue, hasDrain)
	if ref := metav1.GetControllerOfNoCopy(m); ref != nil {
		kept := *ref
		kept.APIVersion = r.shared.str(ref.APIVersion)
		kept.Kind = r.shared.str(ref.Kind)
		out.OwnerReferences = []metav1.OwnerReference{kept}
	}
	return out, nil
}

// maxShared bounds the entries of a sharedValues: beyond it, values are kept
// unshared rather than grown without limit.
const maxShared = 1 << 14

// sharedValues hands out one copy of equal strings and label maps so that
// the cached objects of a ring do not each hold their own. It is safe for
// concurrent use. The maps it returns must not be modified.
type sharedValues struct {
	mu      sync.Mutex
	strs    map[string]string
	labelss map[labelSet]map[string]string
}

// labelSet is the ring's labels of one object.
type labelSet struct {
	shard, drain       string
	hasShard, hasDrain bool
}

// str returns the shared copy of s.
func (v *sharedValues) str(s string) string {
	if s == "" {
		return ""
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if c, ok := v.strs[s]; ok {
		return c
	}
	if v.strs == nil {
		v.strs = map[string]string{}
	}
	if len(v.strs) < maxShared {
		s = strings.Clone(s)
		v.strs[s] = s
	}
	return s
}

// labels returns a map holding shardKey=shard when hasShard and
// drainKey=drain when hasDrain, nil when neither. The keys are the ring's,
// the same for every call.
func (v *sharedValues) labels(shardKey, shard string, hasShard bool, drainKey, drain string, hasDrain bool) map[string]string {
	if !hasShard && !hasDrain {
		return nil
	}
	set := labelSet{shard: shard, drain: drain, hasShard: hasShard, hasDrain: hasDrain}
	v.mu.Lock()
	defer v.mu.Unlock()
	if m, ok := v.labelss[set]; ok {
		return m
	}
	m := make(map[string]string, 2)
	if hasShard {
		m[shardKey] = strings.Clone(shard)
	}
	if hasDrain {
		m[drainKey] = strings.Clone(drain)
	}
	if v.labelss == nil {
		v.labelss = map[labelSet]map[string]string{}
	}
	if len(v.labelss) < maxShared {
		set.shard, set.drain = strings.Clone(shard), strings.Clone(drain)
		v.labelss[set] = m
	}
	return m
}

// transformNamespace keeps a Namespace's name and labels (for the ring's
// namespaceSelector).
func transformNamespace(obj any) (any, error) {
	m, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return obj, nil
	}
	return &metav1.PartialObjectMetadata{
		ObjectMeta: metav1.ObjectMeta{
			Name:            m.Name,
			UID:             m.UID,
			ResourceVersion: m.ResourceVersion,
			Labels:          m.Labels,
		},
	}, nil
}

// indexByController indexes a controlled object under its controller's UID.
func indexByController(obj any) ([]string, error) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return nil, nil
	}
	if uid := controllerUID(m); uid != "" {
		return []string{string(uid)}, nil
	}
	return nil, nil
}

func controllerUID(obj metav1.Object) types.UID {
	if ref := metav1.GetControllerOfNoCopy(obj); ref != nil {
		return ref.UID
	}
	return ""
}

func labelsOf(obj metav1.Object) labels.Set { return obj.GetLabels() }

func equalLabels(a, b map[string]string) bool { return maps.Equal(a, b) }

// resolver returns the ring's Resolver over its metadata caches.
func (r *runner) resolver() owners.Resolver {
	return owners.Resolver{
		IsMain: func(gk schema.GroupKind) bool {
			w, ok := r.byGK[gk]
			return ok && w.res.main
		},
		IsControlled: func(gk schema.GroupKind) bool {
			w, ok := r.byGK[gk]
			return ok && !w.res.main
		},
		Lookup: func(gk schema.GroupKind, namespace, name string) (metav1.Object, bool) {
			w, ok := r.byGK[gk]
			if !ok {
				return nil, false
			}
			if !w.res.namespaced {
				namespace = ""
			}
			return w.get(namespace, name)
		},
	}
}

// rootOf returns the main object at the top of obj's controller chain. It
// reports false when the chain ends outside the ring or at an object not
// (yet) in the caches: when that object arrives, its own events lead back
// here.
func (r *runner) rootOf(gk schema.GroupKind, obj metav1.Object) (item, bool) {
	root, err := r.resolve.Root(gk, obj)
	if err != nil {
		return item{}, false
	}
	return item{gk: root.GroupKind, namespace: root.Namespace, name: root.Name}, true
}

// child is a controlled object found below a main object.
type child struct {
	w   *watched
	obj *object
}

// descendants returns the objects whose controller chain leads to root,
// parents before their children.
func (r *runner) descendants(root *object) []child {
	if len(r.controlled) == 0 {
		return nil
	}
	// An owner controls objects of its own namespace, or of any namespace
	// when it is cluster-scoped.
	type owner struct {
		uid       types.UID
		namespace string
	}
	var out []child
	visited := map[types.UID]bool{root.UID: true}
	queue := []owner{{root.UID, root.Namespace}}
	for len(queue) > 0 && len(visited) < 1<<16 {
		o := queue[0]
		queue = queue[1:]
		for _, w := range r.controlled {
			objs, err := w.informer.GetIndexer().ByIndex(indexController, string(o.uid))
			if err != nil {
				continue
			}
			for _, obj := range objs {
				m, ok := obj.(*object)
				if !ok || visited[m.UID] || (o.namespace != "" && m.Namespace != o.namespace) {
					continue
				}
				visited[m.UID] = true
				out = append(out, child{w: w, obj: m})
				queue = append(queue, owner{m.UID, m.Namespace})
			}
		}
	}
	return out
}
