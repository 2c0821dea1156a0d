package assign

import (
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// TestBoundedNamespaces: a selector names its namespaces only through the
// label every Namespace carries with its own name; the set is what every
// such requirement allows, and nil (watch the cluster) when the selector
// can pick namespaces it does not name or names more than the limit.
func TestBoundedNamespaces(t *testing.T) {
	name := v1alpha1.LabelNamespaceName
	for _, c := range []struct {
		what  string
		sel   *metav1.LabelSelector
		limit int
		want  []string
	}{
		{"one name", &metav1.LabelSelector{MatchLabels: map[string]string{name: "team-a"}}, 8, []string{"team-a"}},
		{"names in a set", &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: name, Operator: metav1.LabelSelectorOpIn, Values: []string{"b", "a", "c"}}}}, 8, []string{"a", "b", "c"}},
		{"names and another label narrow it", &metav1.LabelSelector{MatchLabels: map[string]string{"env": "prod"},
			MatchExpressions: []metav1.LabelSelectorRequirement{{Key: name, Operator: metav1.LabelSelectorOpIn, Values: []string{"a", "b"}}}}, 8, []string{"a", "b"}},
		{"two name requirements intersect", &metav1.LabelSelector{MatchLabels: map[string]string{name: "a"},
			MatchExpressions: []metav1.LabelSelectorRequirement{{Key: name, Operator: metav1.LabelSelectorOpIn, Values: []string{"a", "b"}}}}, 8, []string{"a"}},
		{"more names than the limit", &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: name, Operator: metav1.LabelSelectorOpIn, Values: []string{"a", "b", "c"}}}}, 2, nil},
		{"limit off", &metav1.LabelSelector{MatchLabels: map[string]string{name: "a"}}, -1, nil},
		{"names excluded, not named", &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: name, Operator: metav1.LabelSelectorOpNotIn, Values: []string{"kube-system"}}}}, 8, nil},
		{"another label only", &metav1.LabelSelector{MatchLabels: map[string]string{"team": "a"}}, 8, nil},
		{"the default selector", nil, 8, nil},
	} {
		t.Run(c.what, func(t *testing.T) {
			spec := v1alpha1.ControllerRingSpec{NamespaceSelector: c.sel}
			sel, err := spec.NamespaceLabelSelector()
			if err != nil {
				t.Fatal(err)
			}
			got := boundedNamespaces(sel, c.limit)
			if !slices.Equal(got, c.want) || (got == nil) != (c.want == nil) {
				t.Errorf("got %q, want %q", got, c.want)
			}
		})
	}
}
