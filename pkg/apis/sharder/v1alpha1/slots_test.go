package v1alpha1_test

import (
	"os"
	"strconv"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// TestSlotCountBounds: the CRD's default and maximum slot count are the Go
// constants, and the rules that keep the count fixed assume the same default.
func TestSlotCountBounds(t *testing.T) {
	data, err := os.ReadFile("../../../../config/crd/bases/sharder.dev_controllerrings.yaml")
	if err != nil {
		t.Fatal(err)
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.Unmarshal(data, crd); err != nil {
		t.Fatal(err)
	}
	for _, v := range crd.Spec.Versions {
		spec := v.Schema.OpenAPIV3Schema.Properties["spec"]
		count := spec.Properties["assignment"].Properties["slots"].Properties["count"]
		if count.Default == nil || string(count.Default.Raw) != strconv.Itoa(v1alpha1.DefaultSlotCount) {
			t.Errorf("version %s: spec.assignment.slots.count default %v, want %d", v.Name, count.Default, v1alpha1.DefaultSlotCount)
		}
		if count.Maximum == nil || *count.Maximum != v1alpha1.MaxSlotCount {
			t.Errorf("version %s: spec.assignment.slots.count maximum %v, want %d", v.Name, count.Maximum, v1alpha1.MaxSlotCount)
		}
		found := false
		for _, rule := range spec.XValidations {
			if strings.Contains(rule.Message, "slots.count cannot change") {
				found = true
				if want := ": " + strconv.Itoa(v1alpha1.DefaultSlotCount) + ")"; strings.Count(rule.Rule, want) != 2 {
					t.Errorf("version %s: the rule keeping the count fixed does not default to %d on both sides: %s", v.Name, v1alpha1.DefaultSlotCount, rule.Rule)
				}
			}
		}
		if !found {
			t.Errorf("version %s: no rule keeps spec.assignment.slots.count fixed", v.Name)
		}
	}
}
