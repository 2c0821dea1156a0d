package assign_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/sharder/assign"
	"github.com/sharder-dev/sharder/pkg/sharder/leasecontroller"
)

// TestSlotsRingNotServed runs one sharder with two rings: one of unit Slots,
// which this sharder does not serve yet, and one of unit Objects. The first
// is not ready with reason AssignmentUnitNotServed, says so in an event, and
// none of its objects is labelled, drained or moved, whatever the
// membership does; the second is assigned and rebalanced as usual.
func TestSlotsRingNotServed(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	slots, objects := env().Namespace(t), env().Namespace(t)
	two, three := []string{"a", "b"}, []string{"a", "b", "c"}
	reg := leasecontroller.NewRegistry()
	reg.Set(slots, members(membership.StateReady, two...))
	reg.Set(objects, members(membership.StateReady, two...))

	// Objects of the slot ring: some carrying a shard label (as a sharder
	// serving the ring in object mode by mistake left them), some none.
	for _, name := range []string{"old-0", "old-1", "old-2", "old-3"} {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: slots, Name: name,
			Labels: map[string]string{v1alpha1.ShardLabel(slots): "a"}}}
		g.Expect(env().Client.Create(ctx, cm)).To(Succeed())
	}
	createConfigMaps(t, slots, "new", 6)
	initial := labelsOf(g, slots)

	newRing(t, slots, func(s *v1alpha1.ControllerRingSpec) {
		s.Assignment = &v1alpha1.RingAssignment{Unit: v1alpha1.AssignmentUnitSlots}
	})
	newRing(t, objects, nil)
	names := createConfigMaps(t, objects, "cm", 10)
	startSharder(t, reg, assign.Options{})

	g.Eventually(assigned(objects, names, placed(t, objects, two...)), timeout, poll).Should(Succeed(),
		"the object ring beside it is assigned")
	g.Eventually(func(g Gomega) {
		r := getRing(g, slots)
		g.Expect(r.Status.ObservedGeneration).To(Equal(r.Generation))
		cond := meta.FindStatusCondition(r.Status.Conditions, v1alpha1.ConditionReady)
		g.Expect(cond).NotTo(BeNil())
		g.Expect(cond.Status).To(Equal(metav1.ConditionFalse))
		g.Expect(cond.Reason).To(Equal(v1alpha1.ReasonAssignmentUnitNotServed))
		g.Expect(cond.Message).To(ContainSubstring("does not serve slot mode yet"))
	}, timeout, poll).Should(Succeed())
	g.Eventually(func(g Gomega) []string { return ringEvents(g, slots) }, timeout, poll).Should(
		ContainElement(HavePrefix(v1alpha1.ReasonAssignmentUnitNotServed + ": ")))
	g.Consistently(func(g Gomega) {
		g.Expect(labelsOf(g, slots)).To(Equal(initial))
	}, 2*time.Second, 100*time.Millisecond).Should(Succeed(), "nothing of the slot ring is labelled or drained")

	// A new instance: the object ring rebalances, the slot ring stays as it is.
	acknowledger(t, objects, objects, func(string) bool { return true })
	reg.Set(slots, members(membership.StateReady, three...))
	reg.Set(objects, members(membership.StateReady, three...))
	g.Eventually(assigned(objects, names, placed(t, objects, three...)), timeout, poll).Should(Succeed(),
		"the object ring still rebalances")
	g.Consistently(func(g Gomega) {
		g.Expect(labelsOf(g, slots)).To(Equal(initial))
	}, 2*time.Second, 100*time.Millisecond).Should(Succeed(), "nothing of the slot ring moves")
}
