package assign

import (
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/sharder/assign/internal/metacache"
)

// resource is a resolved resource of a ring.
type resource struct {
	gvr        schema.GroupVersionResource
	gk         schema.GroupKind
	namespaced bool
	main       bool
}

// ringConfig is a ControllerRing's spec resolved for the assignment
// controller. It is immutable once built.
type ringConfig struct {
	name           string
	uid            types.UID
	generation     int64
	leaseNamespace string
	algorithm      string
	virtualNodes   int
	drainTimeout   time.Duration
	selector       labels.Selector
	// namespaces, when not nil, are the only namespaces the selector can
	// select (it names them), and the ring's namespaced resources are
	// watched in these alone (boundedNamespaces).
	namespaces []string
	resources  []resource // main first, in spec order, then controlled
	unresolved []metacache.Problem
}

// sameWatches reports whether a and b watch the same resources in the same
// namespaces, so that a running ring can take b without restarting its
// caches.
func (a *ringConfig) sameWatches(b *ringConfig) bool {
	return slices.Equal(a.resources, b.resources) && slices.Equal(a.namespaces, b.namespaces) && (a.namespaces == nil) == (b.namespaces == nil)
}

// boundedNamespaces returns the namespaces sel can select when it names
// them (a requirement on the label every Namespace carries with its own
// name, kubernetes.io/metadata.name, with = or in), sorted, and nil when it
// can select namespaces it does not name or names more than limit (each
// namespace costs a list and a watch per resource; past a few, one watch
// over the cluster costs the API server less). An empty result means the
// selector selects no namespace.
func boundedNamespaces(sel labels.Selector, limit int) []string {
	if sel == nil || limit <= 0 {
		return nil
	}
	reqs, selectable := sel.Requirements()
	if !selectable {
		return nil
	}
	var names []string
	bounded := false
	for _, req := range reqs {
		if req.Key() != v1alpha1.LabelNamespaceName {
			continue
		}
		switch req.Operator() {
		case selection.Equals, selection.DoubleEquals, selection.In:
		default:
			continue
		}
		values := req.Values().UnsortedList()
		if !bounded {
			names, bounded = values, true
			continue
		}
		// Several requirements on the name: a namespace must meet each.
		names = slices.DeleteFunc(names, func(n string) bool { return !slices.Contains(values, n) })
	}
	if !bounded || len(names) > limit {
		return nil
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// sameConfig reports whether b is the configuration a runs with: the same
// ring at the same generation, watching and missing the same resources.
func (a *ringConfig) sameConfig(b *ringConfig) bool {
	return a.uid == b.uid && a.generation == b.generation && a.sameWatches(b) && slices.Equal(a.unresolved, b.unresolved)
}

// resolveRing turns a ring's spec into a ringConfig. Resources the RESTMapper
// does not know are listed in unresolved; an error means the spec itself is
// unusable (the ring gets reason InvalidSpec).
func resolveRing(ring *v1alpha1.ControllerRing, mapper meta.RESTMapper, namespacedWatchLimit int) (*ringConfig, error) {
	sel, err := ring.Spec.NamespaceLabelSelector()
	if err != nil {
		return nil, err
	}
	cfg := &ringConfig{
		name:           ring.Name,
		uid:            ring.UID,
		generation:     ring.Generation,
		leaseNamespace: ring.Spec.LeaseNamespace,
		algorithm:      ring.Spec.EffectiveAlgorithm(),
		virtualNodes:   ring.Spec.EffectiveVirtualNodes(),
		drainTimeout:   ring.Spec.EffectiveDrainTimeout(),
		selector:       sel,
		namespaces:     boundedNamespaces(sel, namespacedWatchLimit),
	}
	add := func(gr schema.GroupResource, main bool) {
		r, problem := resolveResource(mapper, gr)
		if problem != nil {
			cfg.unresolved = append(cfg.unresolved, *problem)
			return
		}
		r.main = main
		cfg.resources = append(cfg.resources, r)
	}
	for _, gr := range ring.Spec.MainResources() {
		add(gr, true)
	}
	for _, gr := range ring.Spec.ControlledResources() {
		add(gr, false)
	}
	return cfg, nil
}

func resolveResource(mapper meta.RESTMapper, gr schema.GroupResource) (resource, *metacache.Problem) {
	gvk, err := mapper.KindFor(gr.WithVersion(""))
	if err == nil {
		var mapping *meta.RESTMapping
		mapping, err = mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err == nil {
			return resource{
				gvr:        mapping.Resource,
				gk:         gvk.GroupKind(),
				namespaced: mapping.Scope.Name() == meta.RESTScopeNameNamespace,
			}, nil
		}
	}
	return resource{}, metacache.NotServed(gr, err)
}
