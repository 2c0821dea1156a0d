package app

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

func runUninstall(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := NewRootCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(append([]string{"uninstall", "--kubeconfig", kubeconfig(t)}, args...))
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

// ringWebhook is a webhook entry as the sharder writes it for ring, calling
// a server that is not there, with failure policy Fail: while it exists,
// changes to the ring's labels in namespace ns are rejected.
func ringWebhook(ring, kind, label, ns string) admissionregistrationv1.ValidatingWebhook {
	return admissionregistrationv1.ValidatingWebhook{
		Name:         ring + "." + kind + ".sharder.dev",
		ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: ptr.To("https://127.0.0.1:1/validate-labels/" + ring + "/fail")},
		Rules: []admissionregistrationv1.RuleWithOperations{{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
			Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"*"},
				Resources: []string{"configmaps", "configmaps/status", "secrets", "secrets/status"}},
		}},
		FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
		NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{v1alpha1.LabelNamespaceName: ns}},
		ObjectSelector:          &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: label, Operator: metav1.LabelSelectorOpExists}}},
		SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
		AdmissionReviewVersions: []string{"v1"},
	}
}

// assignWebhook is a ring's assigning webhook as the sharder writes it.
func assignWebhook(ring, ns string) admissionregistrationv1.MutatingWebhook {
	return admissionregistrationv1.MutatingWebhook{
		Name:         ring + ".assign.sharder.dev",
		ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: ptr.To("https://127.0.0.1:1/assign-shard/" + ring)},
		Rules: []admissionregistrationv1.RuleWithOperations{{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
			Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"*"}, Resources: []string{"configmaps", "secrets"}},
		}},
		FailurePolicy:           ptr.To(admissionregistrationv1.Ignore),
		NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{v1alpha1.LabelNamespaceName: ns}},
		SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
		AdmissionReviewVersions: []string{"v1"},
	}
}

// TestUninstallRemovesARing leaves a ring as a removed sharder would: the
// ControllerRing, webhook entries with failure policy Fail that nobody
// answers, and labelled objects. sharder uninstall removes all three and
// leaves the other ring alone.
func TestUninstallRemovesARing(t *testing.T) {
	ctx := context.Background()
	g := NewWithT(t)
	ns := env().Namespace(t)
	ring, other := "gone-"+ns, "kept-"+ns
	shard, drain := v1alpha1.ShardLabel(ring), v1alpha1.DrainLabel(ring)
	otherShard := v1alpha1.ShardLabel(other)

	for _, name := range []string{ring, other} {
		g.Expect(env().Client.Create(ctx, &v1alpha1.ControllerRing{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: v1alpha1.ControllerRingSpec{LeaseNamespace: ns, Resources: []v1alpha1.RingResource{{
				Resource: "configmaps", ControlledResources: []metav1.GroupResource{{Resource: "secrets"}},
			}}},
		})).To(Succeed())
	}
	t.Cleanup(func() {
		_ = env().Client.Delete(context.Background(), &v1alpha1.ControllerRing{ObjectMeta: metav1.ObjectMeta{Name: other}})
	})
	objects := []client.Object{
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "assigned", Labels: map[string]string{shard: "inst-a", "team": "x"}}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "draining", Labels: map[string]string{shard: "inst-a", drain: "true"},
			Annotations: map[string]string{v1alpha1.DrainStartedAnnotation(ring): "2026-01-02T03:04:05.000Z", "team": "x"}}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "lone-drain", Labels: map[string]string{drain: "true"}}},
		// A slot label (the ring was of unit Slots once, or is being
		// converted): it goes too.
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "slotted", Labels: map[string]string{v1alpha1.SlotLabel(ring): "7", "team": "y"}}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "other-ring", Labels: map[string]string{otherShard: "inst-z"}}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "child", Labels: map[string]string{shard: "inst-a"}}},
	}
	for _, o := range objects {
		g.Expect(env().Client.Create(ctx, o)).To(Succeed())
	}
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "sharder-" + ns, Labels: map[string]string{"app.kubernetes.io/managed-by": "sharder"}},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{
			ringWebhook(other, "shard-label", otherShard, ns),
			ringWebhook(ring, "shard-label", shard, ns),
			ringWebhook(ring, "drain-label", drain, ns),
		},
	}
	g.Expect(env().Client.Create(ctx, vwc)).To(Succeed())
	t.Cleanup(func() { _ = env().Client.Delete(context.Background(), vwc) })
	// The ring was in admission mode, with nobody left to answer.
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: vwc.Name, Labels: vwc.Labels},
		Webhooks:   []admissionregistrationv1.MutatingWebhook{assignWebhook(ring, ns), assignWebhook(other, ns)},
	}
	g.Expect(env().Client.Create(ctx, mwc)).To(Succeed())
	t.Cleanup(func() { _ = env().Client.Delete(context.Background(), mwc) })

	// The left-over configuration rejects changes to the ring's labels.
	g.Eventually(func() string {
		cm := &corev1.ConfigMap{}
		g.Expect(env().Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "assigned"}, cm)).To(Succeed())
		delete(cm.Labels, shard)
		if err := env().Client.Update(ctx, cm, client.DryRunAll); err != nil {
			return err.Error()
		}
		return "allowed"
	}).Should(ContainSubstring("failed calling webhook"))

	// A dry run says what it would remove and changes nothing.
	out, err := runUninstall(t, ring, "--webhook-configuration-name", vwc.Name, "--dry-run")
	g.Expect(err).NotTo(HaveOccurred(), out)
	g.Expect(out).To(And(
		ContainSubstring("ControllerRing "+ring+": would be deleted"),
		ContainSubstring("MutatingWebhookConfiguration "+vwc.Name+": webhook of ring "+ring+" would be removed"),
		ContainSubstring("ValidatingWebhookConfiguration "+vwc.Name+": webhooks of ring "+ring+" would be removed"),
		ContainSubstring("configmaps: labels of ring "+ring+" would be removed from 4 objects"),
		ContainSubstring("secrets: labels of ring "+ring+" would be removed from 1 objects"),
	))
	g.Expect(env().Client.Get(ctx, types.NamespacedName{Name: ring}, &v1alpha1.ControllerRing{})).To(Succeed(), "a dry run deletes no ring")
	g.Expect(env().Client.Get(ctx, client.ObjectKeyFromObject(vwc), vwc)).To(Succeed())
	g.Expect(vwc.Webhooks).To(HaveLen(3), "a dry run removes no validating webhook")
	g.Expect(env().Client.Get(ctx, client.ObjectKeyFromObject(mwc), mwc)).To(Succeed())
	g.Expect(mwc.Webhooks).To(HaveLen(2), "a dry run removes no assigning webhook")
	for _, o := range objects {
		got := o.DeepCopyObject().(client.Object)
		g.Expect(env().Client.Get(ctx, client.ObjectKeyFromObject(o), got)).To(Succeed())
		g.Expect(got.GetLabels()).To(Equal(o.GetLabels()), "a dry run leaves the labels of %s", o.GetName())
	}

	// The same dry run for scripts: every step, in order, with the counts.
	out, err = runUninstall(t, ring, "--webhook-configuration-name", vwc.Name, "--dry-run", "-o", "json")
	g.Expect(err).NotTo(HaveOccurred(), out)
	report := &UninstallReport{}
	g.Expect(json.Unmarshal([]byte(out), report)).To(Succeed(), out)
	g.Expect(report.Ring).To(Equal(ring))
	g.Expect(report.DryRun).To(BeTrue())
	g.Expect(report.Steps).To(Equal([]UninstallStep{
		{Kind: "ControllerRing", Name: ring, Result: "would be deleted"},
		{Kind: "MutatingWebhookConfiguration", Name: vwc.Name, Result: "webhook of ring " + ring + " would be removed"},
		{Kind: "ValidatingWebhookConfiguration", Name: vwc.Name, Result: "webhooks of ring " + ring + " would be removed"},
		{Kind: "Resource", Name: "configmaps", Result: "labels of ring " + ring + " would be removed from 4 objects", Objects: ptr.To(4)},
		{Kind: "Resource", Name: "secrets", Result: "labels of ring " + ring + " would be removed from 1 objects", Objects: ptr.To(1)},
	}))
	g.Expect(env().Client.Get(ctx, types.NamespacedName{Name: ring}, &v1alpha1.ControllerRing{})).To(Succeed(), "a dry run deletes no ring")

	out, err = runUninstall(t, ring, "--webhook-configuration-name", vwc.Name)
	g.Expect(err).NotTo(HaveOccurred(), out)
	g.Expect(out).To(ContainSubstring("configmaps: labels of ring " + ring + " removed from 4 objects"))
	g.Expect(out).To(ContainSubstring("secrets: labels of ring " + ring + " removed from 1 objects"))

	err = env().Client.Get(ctx, types.NamespacedName{Name: ring}, &v1alpha1.ControllerRing{})
	g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the ControllerRing is deleted: %v", err)
	g.Expect(env().Client.Get(ctx, client.ObjectKeyFromObject(vwc), vwc)).To(Succeed())
	g.Expect(vwc.Webhooks).To(HaveLen(1))
	g.Expect(vwc.Webhooks[0].Name).To(Equal(other + ".shard-label.sharder.dev"))

	g.Expect(out).To(ContainSubstring("MutatingWebhookConfiguration " + vwc.Name + ": webhook of ring " + ring + " removed"))
	g.Expect(env().Client.Get(ctx, client.ObjectKeyFromObject(mwc), mwc)).To(Succeed())
	g.Expect(mwc.Webhooks).To(HaveLen(1))
	g.Expect(mwc.Webhooks[0].Name).To(Equal(other + ".assign.sharder.dev"))

	want := map[string]map[string]string{
		"assigned":   {"team": "x"},
		"draining":   nil,
		"lone-drain": nil,
		"slotted":    {"team": "y"},
		"other-ring": {otherShard: "inst-z"},
		"child":      nil,
	}
	for _, o := range objects {
		got := o.DeepCopyObject().(client.Object)
		g.Expect(env().Client.Get(ctx, client.ObjectKeyFromObject(o), got)).To(Succeed())
		if want[o.GetName()] == nil {
			g.Expect(got.GetLabels()).To(BeEmpty(), o.GetName())
		} else {
			g.Expect(got.GetLabels()).To(Equal(want[o.GetName()]), o.GetName())
		}
		g.Expect(got.GetAnnotations()).NotTo(HaveKey(v1alpha1.DrainStartedAnnotation(ring)), "%s: the drain's start goes with it", o.GetName())
	}
	draining := &corev1.ConfigMap{}
	g.Expect(env().Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "draining"}, draining)).To(Succeed())
	g.Expect(draining.Annotations).To(Equal(map[string]string{"team": "x"}), "other annotations stay")

	// Nothing is left to name the ring's resources: --resource does.
	out, err = runUninstall(t, ring, "--webhook-configuration-name", vwc.Name)
	g.Expect(err).To(MatchError(ContainSubstring("--resource")), out)
	out, err = runUninstall(t, ring, "--webhook-configuration-name", vwc.Name, "--resource", "configmaps")
	g.Expect(err).NotTo(HaveOccurred(), out)
	g.Expect(out).To(ContainSubstring("removed from 0 objects"))

	// The last ring takes the configuration with it.
	out, err = runUninstall(t, other, "--webhook-configuration-name", vwc.Name, "-o", "yaml")
	g.Expect(err).NotTo(HaveOccurred(), out)
	report = &UninstallReport{}
	g.Expect(yaml.UnmarshalStrict([]byte(out), report)).To(Succeed(), out)
	g.Expect(report.DryRun).To(BeFalse())
	g.Expect(report.Steps).To(ContainElement(UninstallStep{Kind: "ValidatingWebhookConfiguration", Name: vwc.Name, Result: "deleted (no other ring)"}))
	err = env().Client.Get(ctx, client.ObjectKeyFromObject(vwc), vwc)
	g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the configuration is deleted with its last ring: %v", err)
	err = env().Client.Get(ctx, client.ObjectKeyFromObject(mwc), mwc)
	g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the mutating configuration is deleted with its last ring: %v", err)
}

// TestUninstallWithoutSharderFinishesTheRingsFinalizer: a ring keeps its
// finalizer while no sharder runs to remove its labels. sharder uninstall
// waits --sharder-wait for one, then removes the finalizer and the labels
// itself.
func TestUninstallWithoutSharderFinishesTheRingsFinalizer(t *testing.T) {
	ctx := context.Background()
	g := NewWithT(t)
	ns := env().Namespace(t)
	ring := "final-" + ns
	shard, drain := v1alpha1.ShardLabel(ring), v1alpha1.DrainLabel(ring)
	g.Expect(env().Client.Create(ctx, &v1alpha1.ControllerRing{
		ObjectMeta: metav1.ObjectMeta{Name: ring, Finalizers: []string{v1alpha1.FinalizerLabels}},
		Spec:       v1alpha1.ControllerRingSpec{LeaseNamespace: ns, Resources: []v1alpha1.RingResource{{Resource: "configmaps"}}},
	})).To(Succeed())
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "draining", Labels: map[string]string{shard: "inst-a", drain: "inst-b"}}}
	g.Expect(env().Client.Create(ctx, cm)).To(Succeed())

	out, err := runUninstall(t, ring, "--webhook-configuration-name", "none-"+ns, "--sharder-wait", "1s", "--timeout", "30s")
	g.Expect(err).NotTo(HaveOccurred(), out)
	g.Expect(out).To(ContainSubstring("finalizer " + v1alpha1.FinalizerLabels + " removed"))
	err = env().Client.Get(ctx, types.NamespacedName{Name: ring}, &v1alpha1.ControllerRing{})
	g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the ControllerRing is deleted: %v", err)
	g.Expect(env().Client.Get(ctx, client.ObjectKeyFromObject(cm), cm)).To(Succeed())
	g.Expect(cm.Labels).To(BeEmpty())
}
