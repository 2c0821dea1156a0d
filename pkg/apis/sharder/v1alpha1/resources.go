package v1alpha1

import (
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// MainResources returns the ring's main resources in the order of
// spec.resources, each once.
func (s *ControllerRingSpec) MainResources() []schema.GroupResource {
	out := make([]schema.GroupResource, 0, len(s.Resources))
	for _, r := range s.Resources {
		if gr := (schema.GroupResource{Group: r.Group, Resource: r.Resource}); !slices.Contains(out, gr) {
			out = append(out, gr)
		}
	}
	return out
}

// ControlledResources returns the ring's controlled resources in the order
// they are listed, each once. A resource listed both as a main and as a
// controlled resource is a main resource, and is not returned here.
func (s *ControllerRingSpec) ControlledResources() []schema.GroupResource {
	var out []schema.GroupResource
	for _, r := range s.Resources {
		for _, c := range r.ControlledResources {
			gr := schema.GroupResource{Group: c.Group, Resource: c.Resource}
			if !slices.Contains(out, gr) && !s.IsMainResource(gr) {
				out = append(out, gr)
			}
		}
	}
	return out
}

// IsMainResource reports whether gr is a main resource of the ring.
func (s *ControllerRingSpec) IsMainResource(gr schema.GroupResource) bool {
	return slices.ContainsFunc(s.Resources, func(r RingResource) bool {
		return r.Group == gr.Group && r.Resource == gr.Resource
	})
}

// IsControlledResource reports whether gr is a controlled resource of the
// ring and not also one of its main resources.
func (s *ControllerRingSpec) IsControlledResource(gr schema.GroupResource) bool {
	if s.IsMainResource(gr) {
		return false
	}
	for _, r := range s.Resources {
		if slices.ContainsFunc(r.ControlledResources, func(c metav1.GroupResource) bool {
			return c.Group == gr.Group && c.Resource == gr.Resource
		}) {
			return true
		}
	}
	return false
}
