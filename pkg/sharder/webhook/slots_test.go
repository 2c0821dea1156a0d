package webhook_test

import (
	"context"
	"slices"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/sharder/webhook"
)

// TestSlotsRingNotServed: a ring of unit Slots, which this sharder does not
// serve yet, gets no entry in the validating configuration nor in the
// mutating one, even in admission mode; a ring of unit Objects beside it
// gets its entries.
func TestSlotsRingNotServed(t *testing.T) {
	ctx := context.Background()
	g := NewWithT(t)
	ns := env().Namespace(t)
	s := startSharder(t, webhook.Options{})
	admission := func(unit string) func(*v1alpha1.ControllerRing) {
		return func(r *v1alpha1.ControllerRing) {
			r.Spec.Assignment = &v1alpha1.RingAssignment{Mode: v1alpha1.AssignmentAdmission, Unit: unit}
		}
	}
	slots := createRing(t, ns, admission(v1alpha1.AssignmentUnitSlots))
	objects := createRing(t, ns, admission(v1alpha1.AssignmentUnitObjects))

	validating := func(g Gomega) []string {
		c := &admissionregistrationv1.ValidatingWebhookConfiguration{}
		g.Expect(env().Client.Get(ctx, types.NamespacedName{Name: s.opts.ConfigurationName}, c)).To(Succeed())
		var names []string
		for _, w := range c.Webhooks {
			names = append(names, w.Name)
		}
		return names
	}
	mutating := func(g Gomega) []string {
		c := &admissionregistrationv1.MutatingWebhookConfiguration{}
		g.Expect(env().Client.Get(ctx, types.NamespacedName{Name: s.opts.ConfigurationName}, c)).To(Succeed())
		var names []string
		for _, w := range c.Webhooks {
			names = append(names, w.Name)
		}
		return names
	}
	wantValidating := []string{objects.Name + ".shard-label.sharder.dev", objects.Name + ".drain-label.sharder.dev"}
	wantMutating := []string{webhook.AssignWebhookName(objects.Name)}
	g.Eventually(validating, 10*time.Second, 50*time.Millisecond).Should(Equal(wantValidating))
	g.Eventually(mutating, 10*time.Second, 50*time.Millisecond).Should(Equal(wantMutating))
	g.Consistently(func(g Gomega) {
		for _, name := range append(validating(g), mutating(g)...) {
			g.Expect(name).NotTo(HavePrefix(slots.Name+"."), "an entry of the slot ring")
		}
	}, time.Second, 100*time.Millisecond).Should(Succeed())
	g.Expect(slices.Concat(validating(g), mutating(g))).To(ConsistOf(slices.Concat(wantValidating, wantMutating)))
}
