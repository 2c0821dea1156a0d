package assign

import (
	"maps"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sharder-dev/sharder/pkg/sharder/assign/internal/metacache"
	"github.com/sharder-dev/sharder/pkg/sharder/assign/internal/owners"
)

func labelsOf(obj metav1.Object) labels.Set { return obj.GetLabels() }

func equalLabels(a, b map[string]string) bool { return maps.Equal(a, b) }

// resolver returns the ring's Resolver over its metadata caches.
func (r *ringAssigner) resolver() owners.Resolver {
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
			return w.cache.Get(namespace, name)
		},
	}
}

// rootOf returns the main object at the top of obj's controller chain. It
// reports false when the chain ends outside the ring or at an object not
// (yet) in the caches: when that object arrives, its own events lead back
// here.
func (r *ringAssigner) rootOf(gk schema.GroupKind, obj metav1.Object) (item, bool) {
	root, err := r.resolve.Root(gk, obj)
	if err != nil {
		return item{}, false
	}
	w, ok := r.byGK[root.GroupKind]
	if !ok {
		return item{}, false
	}
	return item{res: w, namespace: root.Namespace, name: root.Name}, true
}

// child is a controlled object found below a main object.
type child struct {
	w   *resourceCache
	obj *metacache.Object
}

// descendants returns the objects whose controller chain leads to root,
// parents before their children.
func (r *ringAssigner) descendants(root *metacache.Object) []child {
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
			for m := range w.cache.ByController(o.uid) {
				if visited[m.UID] || (o.namespace != "" && m.Namespace != o.namespace) {
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
