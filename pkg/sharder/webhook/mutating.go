package webhook

import (
	"cmp"
	"context"
	"slices"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// MaxAssignTimeoutSeconds bounds the timeout of the assigning webhooks: the
// handler answers from caches (plus one read of the controller for a
// controlled object), and a create it delays is better created unlabelled
// and assigned by the sharder than held.
const MaxAssignTimeoutSeconds = 2

// AssignWebhookName is the name of ring's webhook in the
// MutatingWebhookConfiguration.
func AssignWebhookName(ring string) string { return ring + ".assign.sharder.dev" }

// buildMutatingConfiguration returns the MutatingWebhookConfiguration for
// the rings in admission mode: one webhook per ring, sent only the creation
// of an object of one of the ring's resources, in a namespace of the ring,
// that carries neither of the ring's labels (a ring of unit Slots: no slot
// label). Updates, deletions,
// subresources, other resources and namespaces never reach it. Its failure
// policy is always Ignore: when no replica answers in time the object is
// created unlabelled and the sharder assigns it from its watch, as in watch
// mode. It returns nil when no ring is in admission mode.
//
// Every field the API server would default is set, so that a configuration
// read back compares equal to the one built.
func buildMutatingConfiguration(rings []v1alpha1.ControllerRing, p configParams) *admissionregistrationv1.MutatingWebhookConfiguration {
	cfg := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{
			Name:   p.name,
			Labels: map[string]string{labelManagedBy: managedBy},
		},
	}
	if p.injectFrom != "" {
		cfg.Annotations = map[string]string{annotationInjectCA: p.injectFrom}
	}
	rings = slices.Clone(rings)
	slices.SortFunc(rings, func(a, b v1alpha1.ControllerRing) int { return cmp.Compare(a.Name, b.Name) })
	for i := range rings {
		ring := &rings[i]
		if !ring.Spec.AssignsAtAdmission() {
			continue
		}
		rules := createRules(&ring.Spec)
		if len(rules) == 0 {
			continue
		}
		// Objects created without the ring's labels: a ring of unit Slots
		// has its slot label only (docs/design.md §11).
		selector := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: v1alpha1.ShardLabel(ring.Name), Operator: metav1.LabelSelectorOpDoesNotExist},
			{Key: v1alpha1.DrainLabel(ring.Name), Operator: metav1.LabelSelectorOpDoesNotExist},
		}}
		if ring.Spec.AssignsSlots() {
			selector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: v1alpha1.SlotLabel(ring.Name), Operator: metav1.LabelSelectorOpDoesNotExist},
			}}
		}
		cfg.Webhooks = append(cfg.Webhooks, admissionregistrationv1.MutatingWebhook{
			Name:                    AssignWebhookName(ring.Name),
			ClientConfig:            clientConfig(p, AssignPathPrefix+ring.Name),
			Rules:                   rules,
			FailurePolicy:           ptr.To(admissionregistrationv1.Ignore),
			MatchPolicy:             ptr.To(admissionregistrationv1.Equivalent),
			NamespaceSelector:       namespaceSelector(&ring.Spec),
			ObjectSelector:          selector,
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			TimeoutSeconds:          ptr.To(min(p.timeout, MaxAssignTimeoutSeconds)),
			AdmissionReviewVersions: []string{"v1"},
			ReinvocationPolicy:      ptr.To(admissionregistrationv1.NeverReinvocationPolicy),
		})
	}
	if len(cfg.Webhooks) == 0 {
		return nil
	}
	return cfg
}

// createRules are ringRules for CREATE of the resources themselves: no
// subresource creates an object of the ring.
func createRules(spec *v1alpha1.ControllerRingSpec) []admissionregistrationv1.RuleWithOperations {
	rules := ringRules(spec)
	for i := range rules {
		rules[i].Operations = []admissionregistrationv1.OperationType{admissionregistrationv1.Create}
		rules[i].Resources = slices.DeleteFunc(slices.Clone(rules[i].Resources), func(r string) bool {
			return strings.Contains(r, "/")
		})
	}
	return rules
}

// writeMutating writes the MutatingWebhookConfiguration of the rings in
// admission mode, or deletes it when there is none.
func (k *configWriter) writeMutating(ctx context.Context, active []v1alpha1.ControllerRing, p configParams, owners []metav1.OwnerReference) error {
	desired := buildMutatingConfiguration(active, p)
	if desired == nil {
		return k.deleteManaged(ctx, "MutatingWebhookConfiguration", &admissionregistrationv1.MutatingWebhookConfiguration{})
	}
	return writeConfiguration(ctx, k, desired, &admissionregistrationv1.MutatingWebhookConfiguration{},
		func(c *admissionregistrationv1.MutatingWebhookConfiguration) *[]admissionregistrationv1.MutatingWebhook {
			return &c.Webhooks
		},
		func(w *admissionregistrationv1.MutatingWebhook) *admissionregistrationv1.WebhookClientConfig {
			return &w.ClientConfig
		},
		p, owners)
}
