package v1alpha1_test

import (
	"os"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"

	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/ring"
)

// TestVirtualNodesBound: the CRD bounds spec.virtualNodes with the limit of
// a Lease's weight (membership.MaxVirtualNodes), which the ring never caps.
func TestVirtualNodesBound(t *testing.T) {
	data, err := os.ReadFile("../../../../config/crd/bases/sharder.dev_controllerrings.yaml")
	if err != nil {
		t.Fatal(err)
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.Unmarshal(data, crd); err != nil {
		t.Fatal(err)
	}
	for _, v := range crd.Spec.Versions {
		maximum := v.Schema.OpenAPIV3Schema.Properties["spec"].Properties["virtualNodes"].Maximum
		if maximum == nil || *maximum != membership.MaxVirtualNodes {
			t.Errorf("version %s: spec.virtualNodes maximum %v, want membership.MaxVirtualNodes (%d)", v.Name, maximum, membership.MaxVirtualNodes)
		}
	}
	if membership.MaxVirtualNodes > ring.MaxWeight {
		t.Errorf("membership.MaxVirtualNodes %d exceeds ring.MaxWeight %d: the ring would cap valid weights", membership.MaxVirtualNodes, ring.MaxWeight)
	}
}
