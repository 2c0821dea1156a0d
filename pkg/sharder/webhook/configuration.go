package webhook

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

const (
	// labelManagedBy marks what the sharder created and may delete.
	labelManagedBy = "app.kubernetes.io/managed-by"
	managedBy      = "sharder"
	// annotationInjectCA asks cert-manager's CA injector to fill caBundle.
	annotationInjectCA = "cert-manager.io/inject-ca-from"
)

// configParams is everything of the configuration that is not a ring.
type configParams struct {
	name     string
	identity string
	// fenced sends the sharder's own label writes to the webhook too,
	// which allows only the leading replica's (Options.LeaderLease).
	fenced     bool
	caBundle   []byte // nil with injectFrom
	injectFrom string
	url        string // base URL; "" means service
	service    admissionregistrationv1.ServiceReference
	timeout    int32
}

// buildConfiguration returns the ValidatingWebhookConfiguration for rings.
// Each ring gets two webhooks, both sent only requests that change one of
// its two labels and do not come from the sharder (unless its writes are
// fenced: then the webhook checks which replica sent them):
//
//   - "<ring>.shard-label.sharder.dev" selects objects (old or new) that
//     carry the shard label;
//   - "<ring>.drain-label.sharder.dev" selects objects that carry the drain
//     label but neither old nor new the shard label (a lone drain label).
//
// An objectSelector is evaluated against the old and the new object and
// matches when either does, but it cannot say "this label or that one";
// the pair covers every request in which either label appears, and no
// request reaches both. Objects without the ring's labels never reach the
// webhook, nor do writes that leave both labels as they are (status
// updates, spec changes): the API server filters them out itself. A ring of
// unit Slots gets no label webhook (its slot label is guarded by the slot
// label policy, docs/design.md §11) but one for the sharder's writes of its
// slot table (tableWebhook).
//
// Every field the API server would default is set, so that a configuration
// read back compares equal to the one built.
func buildConfiguration(rings []v1alpha1.ControllerRing, p configParams) *admissionregistrationv1.ValidatingWebhookConfiguration {
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{
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
		if ring.Spec.AssignsSlots() {
			// No shard label to protect: the slot label policy guards its
			// slot label (docs/design.md §11). Its table is checked instead.
			cfg.Webhooks = append(cfg.Webhooks, tableWebhook(ring, p))
			continue
		}
		rules := ringRules(&ring.Spec)
		if len(rules) == 0 {
			continue
		}
		shard, drain := v1alpha1.ShardLabel(ring.Name), v1alpha1.DrainLabel(ring.Name)
		base := admissionregistrationv1.ValidatingWebhook{
			ClientConfig:            clientConfig(p, ringPath(ring.Name, failurePolicy(&ring.Spec))),
			Rules:                   rules,
			FailurePolicy:           ptr.To(failurePolicy(&ring.Spec)),
			MatchPolicy:             ptr.To(admissionregistrationv1.Equivalent),
			NamespaceSelector:       namespaceSelector(&ring.Spec),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			TimeoutSeconds:          ptr.To(p.timeout),
			AdmissionReviewVersions: []string{"v1"},
		}
		conditions := []admissionregistrationv1.MatchCondition{
			{Name: "ring-labels-changed", Expression: celChanged(shard) + " || " + celChanged(drain)},
		}
		if p.identity != "" && !p.fenced {
			// The sharder's moves of an object from one instance to another
			// are checked all the same: only while the instance is gone.
			conditions = append(conditions, admissionregistrationv1.MatchCondition{
				Name: "not-the-sharder",
				Expression: "request.userInfo.username != " + strconv.Quote(p.identity) +
					" || (" + celHas("oldObject", shard) + " && " + celHas("object", shard) + ")",
			})
		}

		onShard := *base.DeepCopy()
		onShard.Name = ring.Name + ".shard-label.sharder.dev"
		onShard.ObjectSelector = existsSelector(shard)
		onShard.MatchConditions = conditions

		onDrain := *base.DeepCopy()
		onDrain.Name = ring.Name + ".drain-label.sharder.dev"
		onDrain.ObjectSelector = existsSelector(drain)
		onDrain.MatchConditions = append(slices.Clone(conditions), admissionregistrationv1.MatchCondition{
			Name:       "no-shard-label",
			Expression: "!(" + celHas("object", shard) + " || " + celHas("oldObject", shard) + ")",
		})
		cfg.Webhooks = append(cfg.Webhooks, onShard, onDrain)
	}
	return cfg
}

// tableWebhook is "<ring>.slot-table.sharder.dev": the sharder's updates
// of the slot ring's status that change its table, checked against the
// Leases of the instances that lose slots (tableHandler).
func tableWebhook(ring *v1alpha1.ControllerRing, p configParams) admissionregistrationv1.ValidatingWebhook {
	conditions := []admissionregistrationv1.MatchCondition{
		{Name: "this-ring", Expression: "object.metadata.name == " + strconv.Quote(ring.Name)},
		{Name: "slot-table-changed", Expression: celTable("object") + " != " + celTable("oldObject")},
	}
	if p.identity != "" {
		conditions = append(conditions, admissionregistrationv1.MatchCondition{
			Name: "the-sharder", Expression: "request.userInfo.username == " + strconv.Quote(p.identity),
		})
	}
	return admissionregistrationv1.ValidatingWebhook{
		Name:         TableWebhookName(ring.Name),
		ClientConfig: clientConfig(p, TablePathPrefix+ring.Name),
		Rules: []admissionregistrationv1.RuleWithOperations{{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update},
			Rule: admissionregistrationv1.Rule{
				APIGroups:   []string{v1alpha1.GroupVersion.Group},
				APIVersions: []string{"*"},
				Resources:   []string{"controllerrings/status"},
				Scope:       ptr.To(admissionregistrationv1.ClusterScope),
			},
		}},
		FailurePolicy:           ptr.To(failurePolicy(&ring.Spec)),
		MatchPolicy:             ptr.To(admissionregistrationv1.Equivalent),
		NamespaceSelector:       &metav1.LabelSelector{},
		ObjectSelector:          &metav1.LabelSelector{},
		SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
		TimeoutSeconds:          ptr.To(p.timeout),
		AdmissionReviewVersions: []string{"v1"},
		MatchConditions:         conditions,
	}
}

// celTable is a CEL expression giving a ring's slot table as a list: empty
// when the status or its table is absent.
func celTable(obj string) string {
	return fmt.Sprintf("(has(%[1]s.status) && has(%[1]s.status.slots) ? [%[1]s.status.slots] : [])", obj)
}

// metadataSubresources are the subresources, besides status, through which
// the API server applies metadata changes of a built-in resource.
var metadataSubresources = map[schema.GroupResource][]string{
	{Group: "", Resource: "namespaces"}: {"finalize"},
}

// ringRules covers exactly the ring's main and controlled resources, one
// rule per API group, with the subresources that can change their labels:
// status, whose update keeps metadata changes for most built-in kinds
// (StatefulSets, Services, Pods, Jobs, ...; a custom resource's status
// update drops them, so the rule costs nothing there), and those of
// metadataSubresources. Other subresources carry another kind (scale,
// eviction, binding) or reset the metadata (pods/ephemeralcontainers,
// pods/resize).
func ringRules(spec *v1alpha1.ControllerRingSpec) []admissionregistrationv1.RuleWithOperations {
	byGroup := map[string][]string{}
	add := func(group, resource string) {
		if resource == "" || slices.Contains(byGroup[group], resource) {
			return
		}
		byGroup[group] = append(byGroup[group], resource, resource+"/status")
		for _, sub := range metadataSubresources[schema.GroupResource{Group: group, Resource: resource}] {
			byGroup[group] = append(byGroup[group], resource+"/"+sub)
		}
	}
	for _, gr := range append(spec.MainResources(), spec.ControlledResources()...) {
		add(gr.Group, gr.Resource)
	}
	groups := make([]string, 0, len(byGroup))
	for g := range byGroup {
		groups = append(groups, g)
	}
	slices.Sort(groups)
	rules := make([]admissionregistrationv1.RuleWithOperations, 0, len(groups))
	for _, g := range groups {
		resources := byGroup[g]
		slices.Sort(resources)
		rules = append(rules, admissionregistrationv1.RuleWithOperations{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
			Rule: admissionregistrationv1.Rule{
				APIGroups:   []string{g},
				APIVersions: []string{"*"},
				Resources:   resources,
				Scope:       ptr.To(admissionregistrationv1.AllScopes),
			},
		})
	}
	return rules
}

func failurePolicy(spec *v1alpha1.ControllerRingSpec) admissionregistrationv1.FailurePolicyType {
	if spec.Webhook != nil && spec.Webhook.FailurePolicy != nil && *spec.Webhook.FailurePolicy == admissionregistrationv1.Fail {
		return admissionregistrationv1.Fail
	}
	return admissionregistrationv1.Ignore
}

// namespaceSelector is the ring's: labels of objects outside it are not the
// sharder's business.
func namespaceSelector(spec *v1alpha1.ControllerRingSpec) *metav1.LabelSelector {
	if spec.NamespaceSelector != nil {
		return spec.NamespaceSelector.DeepCopy()
	}
	return v1alpha1.DefaultNamespaceSelector()
}

func existsSelector(key string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
		Key: key, Operator: metav1.LabelSelectorOpExists,
	}}}
}

func clientConfig(p configParams, path string) admissionregistrationv1.WebhookClientConfig {
	cc := admissionregistrationv1.WebhookClientConfig{CABundle: p.caBundle}
	if p.url != "" {
		cc.URL = ptr.To(strings.TrimSuffix(p.url, "/") + path)
		return cc
	}
	svc := p.service
	svc.Path = ptr.To(path)
	cc.Service = &svc
	return cc
}

// celLabel is a CEL expression giving the label's value of obj as a list:
// empty when obj is null (oldObject of a CREATE), has no labels or lacks
// the key, so that "absent" and "empty value" differ.
func celLabel(obj, key string) string {
	k := strconv.Quote(key)
	return fmt.Sprintf("(%[1]s != null && has(%[1]s.metadata.labels) && %[2]s in %[1]s.metadata.labels ? [%[1]s.metadata.labels[%[2]s]] : [])", obj, k)
}

func celChanged(key string) string {
	return celLabel("object", key) + " != " + celLabel("oldObject", key)
}

func celHas(obj, key string) string {
	return fmt.Sprintf("(%[1]s != null && has(%[1]s.metadata.labels) && %[2]s in %[1]s.metadata.labels)", obj, strconv.Quote(key))
}
