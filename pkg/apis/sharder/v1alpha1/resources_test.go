package v1alpha1_test

import (
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

func TestResourceRoles(t *testing.T) {
	spec := &v1alpha1.ControllerRingSpec{Resources: []v1alpha1.RingResource{
		{Group: "apps", Resource: "deployments", ControlledResources: []metav1.GroupResource{
			{Group: "apps", Resource: "replicasets"}, {Resource: "configmaps"},
		}},
		{Resource: "configmaps", ControlledResources: []metav1.GroupResource{{Group: "apps", Resource: "replicasets"}}},
		{Group: "apps", Resource: "deployments"},
	}}
	deployments := schema.GroupResource{Group: "apps", Resource: "deployments"}
	configmaps := schema.GroupResource{Resource: "configmaps"}
	replicasets := schema.GroupResource{Group: "apps", Resource: "replicasets"}

	if got, want := spec.MainResources(), []schema.GroupResource{deployments, configmaps}; !slices.Equal(got, want) {
		t.Errorf("main resources %v, want %v", got, want)
	}
	// configmaps is listed both ways: it is a main resource.
	if got, want := spec.ControlledResources(), []schema.GroupResource{replicasets}; !slices.Equal(got, want) {
		t.Errorf("controlled resources %v, want %v", got, want)
	}
	for _, c := range []struct {
		gr               schema.GroupResource
		main, controlled bool
	}{
		{deployments, true, false},
		{configmaps, true, false},
		{replicasets, false, true},
		{schema.GroupResource{Resource: "secrets"}, false, false},
	} {
		if main, controlled := spec.IsMainResource(c.gr), spec.IsControlledResource(c.gr); main != c.main || controlled != c.controlled {
			t.Errorf("%s: main %t controlled %t, want %t %t", c.gr, main, controlled, c.main, c.controlled)
		}
	}
}
