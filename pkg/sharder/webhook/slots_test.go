package webhook_test

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/sharder/webhook"
	"github.com/sharder-dev/sharder/pkg/slots"
)

// admissionUnit puts a ring in admission mode with unit.
func admissionUnit(unit string) func(*v1alpha1.ControllerRing) {
	return func(r *v1alpha1.ControllerRing) {
		r.Spec.Assignment = &v1alpha1.RingAssignment{Mode: v1alpha1.AssignmentAdmission, Unit: unit}
	}
}

// webhookNames returns a function that lists the names of the webhooks of
// the validating or mutating configuration named name.
func webhookNames(name string, mutating bool) func(Gomega) []string {
	return func(g Gomega) []string {
		var names []string
		if mutating {
			c := &admissionregistrationv1.MutatingWebhookConfiguration{}
			g.Expect(env().Client.Get(context.Background(), types.NamespacedName{Name: name}, c)).To(Succeed())
			for _, w := range c.Webhooks {
				names = append(names, w.Name)
			}
			return names
		}
		c := &admissionregistrationv1.ValidatingWebhookConfiguration{}
		g.Expect(env().Client.Get(context.Background(), types.NamespacedName{Name: name}, c)).To(Succeed())
		for _, w := range c.Webhooks {
			names = append(names, w.Name)
		}
		return names
	}
}

// TestSlotRingWebhookEntries: a ring of unit Slots gets no label entries
// in the validating configuration (the slot label policy guards its label)
// but the one that checks its slot table, and an assigning entry in the
// mutating one in admission mode; a ring of unit Objects beside it gets its
// entries.
func TestSlotRingWebhookEntries(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	s := startSharder(t, webhook.Options{})
	slotRing := createRing(t, ns, admissionUnit(v1alpha1.AssignmentUnitSlots))
	objects := createRing(t, ns, admissionUnit(v1alpha1.AssignmentUnitObjects))

	validating := webhookNames(s.opts.ConfigurationName, false)
	mutating := webhookNames(s.opts.ConfigurationName, true)
	wantValidating := []string{objects.Name + ".shard-label.sharder.dev", objects.Name + ".drain-label.sharder.dev", webhook.TableWebhookName(slotRing.Name)}
	wantMutating := []string{webhook.AssignWebhookName(objects.Name), webhook.AssignWebhookName(slotRing.Name)}
	g.Eventually(validating, 10*time.Second, 50*time.Millisecond).Should(ConsistOf(wantValidating))
	g.Eventually(mutating, 10*time.Second, 50*time.Millisecond).Should(ConsistOf(wantMutating))
	g.Consistently(func(g Gomega) {
		for _, name := range validating(g) {
			if name != webhook.TableWebhookName(slotRing.Name) {
				g.Expect(name).NotTo(HavePrefix(slotRing.Name+"."), "a label entry of the slot ring")
			}
		}
	}, time.Second, 100*time.Millisecond).Should(Succeed())
	g.Expect(slices.Concat(validating(g), mutating(g))).To(ConsistOf(slices.Concat(wantValidating, wantMutating)))

	c := &admissionregistrationv1.MutatingWebhookConfiguration{}
	g.Expect(env().Client.Get(context.Background(), types.NamespacedName{Name: s.opts.ConfigurationName}, c)).To(Succeed())
	for _, w := range c.Webhooks {
		if w.Name == webhook.AssignWebhookName(slotRing.Name) {
			g.Expect(w.ObjectSelector).To(Equal(&metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: v1alpha1.SlotLabel(slotRing.Name), Operator: metav1.LabelSelectorOpDoesNotExist}}}))
		}
	}
}

// TestSlotRingAdmission: in admission mode, the create response of a slot
// ring's main object carries its slot label, and a controlled object gets
// its controller's; a name still to be generated, and a controller without
// a slot label, leave the object to the sharder's labeler.
func TestSlotRingAdmission(t *testing.T) {
	ctx := context.Background()
	g := NewWithT(t)
	ns := env().Namespace(t)
	r := createRing(t, ns, admissionMode(ns), admissionUnit(v1alpha1.AssignmentUnitSlots), func(r *v1alpha1.ControllerRing) {
		r.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{v1alpha1.LabelNamespaceName: ns}}
		r.Spec.Assignment.Slots = &v1alpha1.RingSlots{Count: 64}
	})
	label := v1alpha1.SlotLabel(r.Name)
	alice := clientAs(t, userAlice)
	startSharder(t, webhook.Options{})
	slotOf := func(name string) string {
		return strconv.Itoa(slots.ForMainObject(&r.Spec, "", "ConfigMap", ns, name))
	}
	g.Eventually(func(g Gomega) {
		probe := labelled(ns, "probe", nil)
		g.Expect(alice.Create(ctx, probe, client.DryRunAll)).To(Succeed())
		g.Expect(probe.Labels).To(HaveKeyWithValue(label, slotOf("probe")))
	}).WithTimeout(30 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())

	for i := range 5 {
		cm := labelled(ns, "cm-"+strconv.Itoa(i), map[string]string{"app": "web"})
		g.Expect(alice.Create(ctx, cm)).To(Succeed())
		g.Expect(cm.Labels).To(HaveKeyWithValue(label, slotOf(cm.Name)), "the create response carries the slot label")
		g.Expect(cm.Labels).To(HaveKeyWithValue("app", "web"))
		g.Expect(cm.Labels).NotTo(HaveKey(v1alpha1.ShardLabel(r.Name)))
	}

	generated := labelled(ns, "", nil)
	generated.GenerateName = "generated-"
	g.Expect(alice.Create(ctx, generated)).To(Succeed())
	g.Expect(generated.Labels).NotTo(HaveKey(label))

	owner := &corev1.ConfigMap{}
	g.Expect(alice.Get(ctx, types.NamespacedName{Namespace: ns, Name: "cm-0"}, owner)).To(Succeed())
	child := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "child", Namespace: ns, OwnerReferences: []metav1.OwnerReference{{
		APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID, Controller: ptr.To(true)}}}}
	g.Expect(alice.Create(ctx, child)).To(Succeed())
	g.Expect(child.Labels).To(HaveKeyWithValue(label, owner.Labels[label]), "a controlled object gets its controller's slot")

	unlabelledOwner := &corev1.ConfigMap{}
	g.Expect(alice.Get(ctx, client.ObjectKeyFromObject(generated), unlabelledOwner)).To(Succeed())
	orphan := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "waits", Namespace: ns, OwnerReferences: []metav1.OwnerReference{{
		APIVersion: "v1", Kind: "ConfigMap", Name: unlabelledOwner.Name, UID: unlabelledOwner.UID, Controller: ptr.To(true)}}}}
	g.Expect(alice.Create(ctx, orphan)).To(Succeed())
	g.Expect(orphan.Labels).NotTo(HaveKey(label), "a controller without a slot label leaves its child to the labeler")

	set := labelled(ns, "set", map[string]string{label: "5"})
	g.Expect(alice.Create(ctx, set)).To(Succeed())
	g.Expect(set.Labels).To(HaveKeyWithValue(label, "5"), "a slot label set by the creator is not changed")
}
