package assign

import (
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
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
	resources      []resource // main first, in spec order, then controlled
	unresolved     []metacache.Problem
}

// sameWatches reports whether a and b watch the same resources, so that a
// running ring can take b without restarting its caches.
func (a *ringConfig) sameWatches(b *ringConfig) bool {
	return slices.Equal(a.resources, b.resources)
}

// sameConfig reports whether b is the configuration a runs with: the same
// ring at the same generation, watching and missing the same resources.
func (a *ringConfig) sameConfig(b *ringConfig) bool {
	return a.uid == b.uid && a.generation == b.generation && a.sameWatches(b) && slices.Equal(a.unresolved, b.unresolved)
}

// resolveRing turns a ring's spec into a ringConfig. Resources the RESTMapper
// does not know are listed in unresolved; an error means the spec itself is
// unusable (the ring gets reason InvalidSpec).
func resolveRing(ring *v1alpha1.ControllerRing, mapper meta.RESTMapper) (*ringConfig, error) {
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
