package slotpolicy

import (
	"maps"
	"slices"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// PolicyName is the name of the ValidatingAdmissionPolicy guarding the slot
// label, as config/policy and the chart install it.
const PolicyName = "slot-label.sharder.dev"

// BindingName returns the name of the binding of ring's slot label policy.
func BindingName(ring string) string { return ring + "." + PolicyName }

// Binding returns the binding of the slot label policy to ring: the ring as
// the policy's parameter, matching creates and updates of the ring's main
// and controlled resources and of their status subresources (a status
// update of most built-in kinds keeps label changes), in the namespaces the
// ring selects (cluster-scoped objects always), denying what the policy
// refuses. It is owned by the ring, so that it goes with the ring; a ring
// already gone while its binding remains leaves the binding allowing
// everything rather than denying every write of the ring's resources.
func Binding(ring *v1alpha1.ControllerRing) *admissionregistrationv1.ValidatingAdmissionPolicyBinding {
	byGroup := map[string][]string{}
	add := func(group, resource string) {
		byGroup[group] = append(byGroup[group], resource, resource+"/status")
	}
	for _, r := range ring.Spec.Resources {
		add(r.Group, r.Resource)
		for _, c := range r.ControlledResources {
			add(c.Group, c.Resource)
		}
	}
	rules := make([]admissionregistrationv1.NamedRuleWithOperations, 0, len(byGroup))
	for _, group := range slices.Sorted(maps.Keys(byGroup)) {
		resources := byGroup[group]
		slices.Sort(resources)
		rules = append(rules, admissionregistrationv1.NamedRuleWithOperations{RuleWithOperations: admissionregistrationv1.RuleWithOperations{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
			Rule: admissionregistrationv1.Rule{
				APIGroups:   []string{group},
				APIVersions: []string{"*"},
				Resources:   slices.Compact(resources),
			},
		}})
	}
	namespaces := ring.Spec.NamespaceSelector
	if namespaces == nil {
		namespaces = v1alpha1.DefaultNamespaceSelector()
	}
	return &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{
			Name: BindingName(ring.Name),
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: v1alpha1.GroupVersion.String(),
				Kind:       "ControllerRing",
				Name:       ring.Name,
				UID:        ring.UID,
			}},
		},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        PolicyName,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
			ParamRef: &admissionregistrationv1.ParamRef{
				Name:                    ring.Name,
				ParameterNotFoundAction: ptr.To(admissionregistrationv1.AllowAction),
			},
			MatchResources: &admissionregistrationv1.MatchResources{
				NamespaceSelector: namespaces.DeepCopy(),
				ResourceRules:     rules,
			},
		},
	}
}
