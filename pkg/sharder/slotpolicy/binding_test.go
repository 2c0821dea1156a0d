package slotpolicy

import (
	"testing"

	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// TestBinding: the binding matches the ring's main and controlled
// resources and their status, one rule per group in a fixed order, a
// resource listed twice once, in the ring's namespaces (by default all but
// kube-system), with the ring as parameter and owner.
func TestBinding(t *testing.T) {
	g := NewWithT(t)
	ring := &v1alpha1.ControllerRing{
		ObjectMeta: metav1.ObjectMeta{Name: "widgets", UID: "uid-1"},
		Spec: v1alpha1.ControllerRingSpec{Resources: []v1alpha1.RingResource{
			{Group: "example.dev", Resource: "widgets", ControlledResources: []metav1.GroupResource{
				{Group: "apps", Resource: "statefulsets"}, {Resource: "services"},
			}},
			{Resource: "configmaps", ControlledResources: []metav1.GroupResource{{Resource: "services"}}},
		}},
	}
	b := Binding(ring)
	g.Expect(b.Name).To(Equal("widgets.slot-label.sharder.dev"))
	g.Expect(b.OwnerReferences).To(ConsistOf(metav1.OwnerReference{APIVersion: "sharder.dev/v1alpha1", Kind: "ControllerRing", Name: "widgets", UID: "uid-1"}))
	g.Expect(b.Spec.PolicyName).To(Equal(PolicyName))
	g.Expect(b.Spec.ValidationActions).To(Equal([]admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}))
	g.Expect(b.Spec.ParamRef.Name).To(Equal("widgets"))
	g.Expect(*b.Spec.ParamRef.ParameterNotFoundAction).To(Equal(admissionregistrationv1.AllowAction))
	g.Expect(b.Spec.MatchResources.NamespaceSelector).To(Equal(v1alpha1.DefaultNamespaceSelector()))
	var groups [][]string
	var resources [][]string
	for _, r := range b.Spec.MatchResources.ResourceRules {
		g.Expect(r.Operations).To(ConsistOf(admissionregistrationv1.Create, admissionregistrationv1.Update))
		g.Expect(r.APIVersions).To(Equal([]string{"*"}))
		groups = append(groups, r.APIGroups)
		resources = append(resources, r.Resources)
	}
	g.Expect(groups).To(Equal([][]string{{""}, {"apps"}, {"example.dev"}}))
	g.Expect(resources).To(Equal([][]string{
		{"configmaps", "configmaps/status", "services", "services/status"},
		{"statefulsets", "statefulsets/status"},
		{"widgets", "widgets/status"},
	}))

	selector := &metav1.LabelSelector{MatchLabels: map[string]string{"team": "a"}}
	ring.Spec.NamespaceSelector = selector
	g.Expect(Binding(ring).Spec.MatchResources.NamespaceSelector).To(Equal(selector))
}
