package assign

import (
	"maps"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"

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
	caches := make([]*metacache.Cache, len(r.controlled))
	for i, w := range r.controlled {
		caches[i] = w.cache
	}
	found := metacache.Descendants(root, caches, nil)
	out := make([]child, len(found))
	for i, d := range found {
		out[i] = child{w: r.controlled[d.Cache], obj: d.Object}
	}
	return out
}
