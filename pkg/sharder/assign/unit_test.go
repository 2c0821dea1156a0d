package assign_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/internal/testenv"
	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/sharder/assign"
	"github.com/sharder-dev/sharder/pkg/sharder/leasecontroller"
	"github.com/sharder-dev/sharder/pkg/sharder/slottable"
	"github.com/sharder-dev/sharder/pkg/slots"
)

const slotCount = 16

// withSlotTable returns a setup for startSharderWith that adds the lease
// controller and the slot table controller, sharing reg, as sharder run
// does.
func withSlotTable(reg *leasecontroller.Registry) func(ctrl.Manager) error {
	return withSlotTableBinding(reg, false)
}

// withSlotTableBinding is withSlotTable; binding has the slot table
// controller write the rings' slot label policy bindings.
func withSlotTableBinding(reg *leasecontroller.Registry, binding bool) func(ctrl.Manager) error {
	return func(mgr ctrl.Manager) error {
		identity := membership.SharderHolderPrefix + "test"
		lc, err := leasecontroller.New(leasecontroller.Options{Registry: reg, Identity: identity})
		if err != nil {
			return err
		}
		if err := lc.SetupWithManager(mgr); err != nil {
			return err
		}
		tc, err := slottable.New(slottable.Options{Registry: reg, Identity: identity, SkipBinding: !binding})
		if err != nil {
			return err
		}
		return tc.SetupWithManager(mgr)
	}
}

// newSlotRing creates a ring of unit Slots of ConfigMaps of ns, of
// slotCount slots.
func newSlotRing(t *testing.T, ns string, mode string) *v1alpha1.ControllerRing {
	t.Helper()
	return newRing(t, ns, func(s *v1alpha1.ControllerRingSpec) {
		s.Assignment = &v1alpha1.RingAssignment{Mode: mode, Unit: v1alpha1.AssignmentUnitSlots,
			Slots: &v1alpha1.RingSlots{Count: slotCount}}
	})
}

// slotLabelled returns a check for Eventually: every ConfigMap of ns
// carries its slot label, and none a shard or drain label.
func slotLabelled(ring *v1alpha1.ControllerRing, ns string) func(Gomega) {
	return func(g Gomega) {
		got := labelsOf(g, ns)
		g.Expect(got).NotTo(BeEmpty())
		for name, l := range got {
			want := slots.ForMainObject(&ring.Spec, "", "ConfigMap", ns, name)
			g.Expect(l).To(HaveKeyWithValue(v1alpha1.SlotLabel(ring.Name), fmt.Sprint(want)), name)
			g.Expect(l).NotTo(HaveKey(v1alpha1.ShardLabel(ring.Name)), name)
			g.Expect(l).NotTo(HaveKey(v1alpha1.DrainLabel(ring.Name)), name)
		}
	}
}

// acknowledgeReleases annotates the Lease of every instance the ring's
// table asks to release slots with the table's revision, as an instance
// acknowledges.
func acknowledgeReleases(g Gomega, ns string) {
	ring := getRing(g, ns)
	if ring.Status.Slots == nil {
		return
	}
	for _, h := range ring.Status.Slots.Instances {
		if len(h.Releasing) == 0 {
			continue
		}
		lease := &coordinationv1.Lease{}
		g.Expect(env().Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: h.Name}, lease)).To(Succeed())
		if lease.Annotations == nil {
			lease.Annotations = map[string]string{}
		}
		lease.Annotations[v1alpha1.AnnotationSlotsAcknowledged] = fmt.Sprintf("%s/%d", ring.UID, ring.Status.Slots.Revision)
		g.Expect(env().Client.Update(context.Background(), lease)).To(Succeed())
	}
}

// TestSlotRing serves a ring of unit Slots behind the lease controller and
// the slot table controller, as sharder run does: every object gets its
// slot label and no shard label, the table grants every slot to the ready
// instances, the status counts their slots; a new instance moves slots
// without writing any object; deleting the ring removes every slot label.
func TestSlotRing(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := env().Namespace(t)
	createConfigMaps(t, ns, "old", 8)
	ring := newSlotRing(t, ns, "")
	createLease(t, ns, "a")
	createLease(t, ns, "b")
	reg := leasecontroller.NewRegistry()
	startSharderWith(t, env().Config, reg, assign.Options{}, withSlotTable(reg))

	g.Eventually(slotLabelled(ring, ns), timeout, poll).Should(Succeed())
	createConfigMaps(t, ns, "new", 4)
	g.Eventually(slotLabelled(ring, ns), timeout, poll).Should(Succeed(), "objects created later are labelled")

	settled := func(ids ...string) func(Gomega) {
		return func(g Gomega) {
			acknowledgeReleases(g, ns)
			r := getRing(g, ns)
			g.Expect(r.Status.ObservedGeneration).To(Equal(r.Generation))
			cond := meta.FindStatusCondition(r.Status.Conditions, v1alpha1.ConditionReady)
			g.Expect(cond).NotTo(BeNil())
			g.Expect(cond.Status).To(Equal(metav1.ConditionTrue), cond.Message)
			g.Expect(r.Status.Instances).To(BeEquivalentTo(len(ids)))
			g.Expect(r.Status.AvailableInstances).To(BeEquivalentTo(len(ids)))
			g.Expect(r.Status.UnassignedObjects).To(BeZero())
			g.Expect(r.Status.Slots).NotTo(BeNil())
			var total int32
			g.Expect(r.Status.Members).To(HaveLen(len(ids)))
			for _, m := range r.Status.Members {
				g.Expect(ids).To(ContainElement(m.Name))
				g.Expect(m.State).To(Equal(string(membership.StateReady)))
				g.Expect(m.Slots).To(BeNumerically(">=", slotCount/len(ids)), m.Name)
				g.Expect(m.Objects).To(BeZero())
				total += m.Slots
			}
			g.Expect(total).To(BeEquivalentTo(slotCount), "the table grants every slot")
			for _, h := range r.Status.Slots.Instances {
				g.Expect(h.Releasing).To(BeEmpty())
			}
		}
	}
	g.Eventually(settled("a", "b"), timeout, poll).Should(Succeed())

	// A new instance: slots move, no object is written.
	before := resourceVersions(g, ns)
	createLease(t, ns, "c")
	g.Eventually(settled("a", "b", "c"), timeout, poll).Should(Succeed())
	g.Consistently(func(g Gomega) {
		g.Expect(resourceVersions(g, ns)).To(Equal(before))
	}, time.Second, 100*time.Millisecond).Should(Succeed(), "moving slots writes no object")

	// Deleting the ring removes every slot label, then the ring goes.
	g.Expect(env().Client.Delete(ctx, ring)).To(Succeed())
	g.Eventually(func(g Gomega) {
		err := env().Client.Get(ctx, client.ObjectKeyFromObject(ring), &v1alpha1.ControllerRing{})
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "ring is gone: %v", err)
	}, timeout, poll).Should(Succeed())
	for name, l := range labelsOf(g, ns) {
		g.Expect(l).NotTo(HaveKey(v1alpha1.SlotLabel(ns)), name)
	}
}

// TestSlotRingBesideObjectRing: a slot ring and an object ring served by
// one sharder do not disturb each other: the object ring is assigned and
// rebalanced, the slot ring's objects get slot labels only.
func TestSlotRingBesideObjectRing(t *testing.T) {
	g := NewWithT(t)
	slotNS, objects := env().Namespace(t), env().Namespace(t)
	two, three := []string{"a", "b"}, []string{"a", "b", "c"}
	reg := leasecontroller.NewRegistry()
	reg.Set(slotNS, members(membership.StateReady, two...))
	reg.Set(objects, members(membership.StateReady, two...))

	createConfigMaps(t, slotNS, "cm", 6)
	ring := newSlotRing(t, slotNS, "")
	newRing(t, objects, nil)
	names := createConfigMaps(t, objects, "cm", 10)
	startSharder(t, reg, assign.Options{})

	g.Eventually(assigned(objects, names, placed(t, objects, two...)), timeout, poll).Should(Succeed())
	g.Eventually(slotLabelled(ring, slotNS), timeout, poll).Should(Succeed())
	g.Eventually(func(g Gomega) {
		r := getRing(g, slotNS)
		cond := meta.FindStatusCondition(r.Status.Conditions, v1alpha1.ConditionReady)
		g.Expect(cond).NotTo(BeNil())
		g.Expect(cond.Reason).To(Equal(v1alpha1.ReasonReady))
		g.Expect(r.Status.Members).To(HaveLen(2))
	}, timeout, poll).Should(Succeed())
	labelled := labelsOf(g, slotNS)

	acknowledger(t, objects, objects, func(string) bool { return true })
	reg.Set(slotNS, members(membership.StateReady, three...))
	reg.Set(objects, members(membership.StateReady, three...))
	g.Eventually(assigned(objects, names, placed(t, objects, three...)), timeout, poll).Should(Succeed(),
		"the object ring still rebalances")
	g.Eventually(func(g Gomega) { g.Expect(getRing(g, slotNS).Status.Members).To(HaveLen(3)) }, timeout, poll).Should(Succeed())
	g.Expect(labelsOf(g, slotNS)).To(Equal(labelled), "nothing of the slot ring is relabelled")
}

// TestSlotRingNamespacesChange: a slot ring whose namespaceSelector comes
// to select another namespace has its labeler restarted, which labels the
// objects there; those of the first namespace keep their labels untouched.
func TestSlotRingNamespacesChange(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns, other := env().Namespace(t), env().Namespace(t)
	ring := newSlotRing(t, ns, "")
	createConfigMaps(t, ns, "cm", 3)
	createConfigMaps(t, other, "cm", 3)
	reg := leasecontroller.NewRegistry()
	reg.Set(ns, members(membership.StateReady, "a"))
	startSharder(t, reg, assign.Options{})

	g.Eventually(slotLabelled(ring, ns), timeout, poll).Should(Succeed())
	before := resourceVersions(g, ns)
	g.Consistently(func(g Gomega) {
		for name, l := range labelsOf(g, other) {
			g.Expect(l).NotTo(HaveKey(v1alpha1.SlotLabel(ns)), name)
		}
	}, 500*time.Millisecond, 100*time.Millisecond).Should(Succeed(), "a namespace the ring does not select")

	g.Eventually(func(g Gomega) {
		r := getRing(g, ns)
		r.Spec.NamespaceSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
			Key: v1alpha1.LabelNamespaceName, Operator: metav1.LabelSelectorOpIn, Values: []string{ns, other}}}}
		g.Expect(env().Client.Update(ctx, r)).To(Succeed())
	}, timeout, poll).Should(Succeed())
	ring = getRing(g, ns)
	g.Eventually(slotLabelled(ring, other), timeout, poll).Should(Succeed())
	g.Eventually(func(g Gomega) {
		r := getRing(g, ns)
		g.Expect(r.Status.ObservedGeneration).To(Equal(r.Generation))
	}, timeout, poll).Should(Succeed())
	g.Expect(resourceVersions(g, ns)).To(Equal(before), "the labelled objects are not written again")
}

// TestSlotRingUnderPolicy runs a slot ring under the slot label policy
// (config/policy) with the binding the slot table controller writes: the
// labeler sets slot labels on existing objects, nobody changes one, and
// deleting the ring removes them all (the policy lets the sharder, the ring
// being deleted), then the ring goes.
func TestSlotRingUnderPolicy(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	manifest, err := os.ReadFile(filepath.Join("..", "..", "..", "config", "policy", "slot_label_policy.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	objs, err := testenv.DecodeObjects(manifest)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(objs).To(HaveLen(1))
	policy := objs[0]
	g.Expect(env().Client.Create(ctx, policy)).To(Succeed())
	t.Cleanup(func() { _ = env().Client.Delete(context.Background(), policy) })

	ns := env().Namespace(t)
	createConfigMaps(t, ns, "cm", 4)
	ring := newSlotRing(t, ns, "")
	createLease(t, ns, "a")
	reg := leasecontroller.NewRegistry()
	startSharderWith(t, env().Config, reg, assign.Options{}, withSlotTableBinding(reg, true))
	g.Eventually(slotLabelled(ring, ns), timeout, poll).Should(Succeed())

	// The policy is in force: a slot label never changes.
	key := v1alpha1.SlotLabel(ring.Name)
	g.Eventually(func(g Gomega) {
		cm := &corev1.ConfigMap{}
		g.Expect(env().Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "cm-0"}, cm)).To(Succeed())
		slot, err := strconv.Atoi(cm.Labels[key])
		g.Expect(err).NotTo(HaveOccurred())
		cm.Labels[key] = strconv.Itoa((slot + 1) % slotCount)
		err = env().Client.Update(ctx, cm, client.DryRunAll)
		g.Expect(apierrors.IsForbidden(err) || apierrors.IsInvalid(err)).To(BeTrue(), "changing a slot label: %v", err)
	}, timeout, poll).Should(Succeed())
	createConfigMaps(t, ns, "later", 2)
	g.Eventually(slotLabelled(ring, ns), timeout, poll).Should(Succeed(), "the labeler labels existing objects under the policy")

	g.Expect(env().Client.Delete(ctx, ring)).To(Succeed())
	g.Eventually(func(g Gomega) {
		err := env().Client.Get(ctx, client.ObjectKeyFromObject(ring), &v1alpha1.ControllerRing{})
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "ring is gone: %v", err)
	}, timeout, poll).Should(Succeed())
	for name, l := range labelsOf(g, ns) {
		g.Expect(l).NotTo(HaveKey(key), name)
	}
}
