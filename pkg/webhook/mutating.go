package webhook

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

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
// that carries neither of the ring's labels. Updates, deletions,
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
		shard, drain := v1alpha1.ShardLabel(ring.Name), v1alpha1.DrainLabel(ring.Name)
		cfg.Webhooks = append(cfg.Webhooks, admissionregistrationv1.MutatingWebhook{
			Name:              AssignWebhookName(ring.Name),
			ClientConfig:      clientConfig(p, AssignPathPrefix+ring.Name),
			Rules:             rules,
			FailurePolicy:     ptr.To(admissionregistrationv1.Ignore),
			MatchPolicy:       ptr.To(admissionregistrationv1.Equivalent),
			NamespaceSelector: namespaceSelector(&ring.Spec),
			ObjectSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: shard, Operator: metav1.LabelSelectorOpDoesNotExist},
				{Key: drain, Operator: metav1.LabelSelectorOpDoesNotExist},
			}},
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
func (k *keeper) writeMutating(ctx context.Context, active []v1alpha1.ControllerRing, p configParams, owners []metav1.OwnerReference) error {
	const kind = "MutatingWebhookConfiguration"
	desired := buildMutatingConfiguration(active, p)
	if desired == nil {
		return k.deleteManaged(ctx, kind, &admissionregistrationv1.MutatingWebhookConfiguration{})
	}
	log := logf.FromContext(ctx).WithValues("configuration", k.opts.ConfigurationName, "kind", kind)
	desired.OwnerReferences = owners
	current := &admissionregistrationv1.MutatingWebhookConfiguration{}
	err := k.client.Get(ctx, types.NamespacedName{Name: k.opts.ConfigurationName}, current)
	if apierrors.IsNotFound(err) {
		if err := k.client.Create(ctx, desired); err != nil {
			return fmt.Errorf("creating %s %s: %w", kind, desired.Name, err)
		}
		log.Info("Created the webhook configuration", "webhooks", len(desired.Webhooks))
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading %s %s: %w", kind, k.opts.ConfigurationName, err)
	}
	if p.injectFrom != "" {
		// cert-manager owns the bundle: keep what it injected.
		var injected []byte
		for _, w := range current.Webhooks {
			if len(w.ClientConfig.CABundle) > 0 {
				injected = w.ClientConfig.CABundle
			}
		}
		for i := range desired.Webhooks {
			desired.Webhooks[i].ClientConfig.CABundle = injected
		}
	}
	updated := current.DeepCopy()
	metaChanged := k.keepMeta(updated, owners)
	if !metaChanged && equality.Semantic.DeepEqual(current.Webhooks, desired.Webhooks) {
		return nil
	}
	updated.Webhooks = desired.Webhooks
	if err := k.client.Update(ctx, updated); err != nil {
		return fmt.Errorf("updating %s %s: %w", kind, updated.Name, err)
	}
	log.Info("Updated the webhook configuration", "webhooks", len(desired.Webhooks))
	return nil
}
