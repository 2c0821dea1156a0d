package webhook

import (
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/ring"
	"github.com/sharder-dev/sharder/pkg/sharder/ringbuilds"
)

// TestMainChoiceWithAStaleRing checks the choice of a main object's
// instance while the ring in use was built before the last membership
// change: an instance that is ready now is accepted at once, the ring's pick
// is used only while it is ready, and nothing is chosen before the first
// build.
func TestMainChoiceWithAStaleRing(t *testing.T) {
	g := NewWithT(t)
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	clk := clocktesting.NewFakeClock(now)
	builds := newRingBuilds(nil, &ringbuilds.Builds{}, clk, logr.Discard(), func() bool { return true })
	t.Cleanup(builds.cancel)
	rg := &v1alpha1.ControllerRing{ObjectMeta: metav1.ObjectMeta{Name: "r"}, Spec: v1alpha1.ControllerRingSpec{LeaseNamespace: "ns"}}
	builds.byName["r"] = &ringBuild{name: "r", wake: make(chan struct{}, 1), cancel: func() {}}
	builds.byName["r"].spec.Store(&ringSpec{leaseNamespace: "ns"})
	h := &labelHandler{clock: clk, builds: builds}
	gvk := metav1.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}
	obj := func(name string) *metav1.PartialObjectMetadata {
		return &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}}
	}
	lease := func(id, holder string) *coordinationv1.Lease {
		return &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: id, Labels: map[string]string{v1alpha1.LabelRing: "r"}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder), LeaseDurationSeconds: ptr.To[int32](10),
				RenewTime: ptr.To(metav1.NewMicroTime(now))},
		}
	}

	// Before the first build: no pick, but a ready instance asked for is.
	builds.leaseChanged(nil, lease("a", "a"))
	builds.leaseChanged(nil, lease("b", "b"))
	instance, why, err := h.mainChoice(rg, gvk, obj("x"), "")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(instance).To(BeEmpty())
	g.Expect(why).To(ContainSubstring("being built"))
	instance, _, err = h.mainChoice(rg, gvk, obj("x"), "b")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(instance).To(Equal("b"))

	// The ring over a and b, built before b left.
	built, err := ring.New(v1alpha1.DefaultAlgorithm, []ring.Member{{ID: "a", VirtualNodes: 8}, {ID: "b", VirtualNodes: 8}})
	g.Expect(err).NotTo(HaveOccurred())
	builds.byName["r"].built.Store(&builtRing{ring: built})
	onB := ""
	for i := range 100 {
		name := "obj-" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		if pick, _ := built.Lookup(ring.ObjectKey("", "ConfigMap", "default", name)); pick == "b" {
			onB = name
			break
		}
	}
	g.Expect(onB).NotTo(BeEmpty())
	instance, _, err = h.mainChoice(rg, gvk, obj(onB), "")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(instance).To(Equal("b"))

	// b releases its Lease; the new ring is not built yet: b is not chosen,
	// asked for or picked.
	old := lease("b", "b")
	builds.leaseChanged(old, lease("b", ""))
	g.Expect(builds.byName["r"].wake).To(HaveLen(1), "the builder is woken")
	instance, why, err = h.mainChoice(rg, gvk, obj(onB), "")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(instance).To(BeEmpty())
	g.Expect(why).To(ContainSubstring(`"b"`))
	instance, _, err = h.mainChoice(rg, gvk, obj(onB), "b")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(instance).To(BeEmpty())

	// An instance whose renewal is overdue is not chosen either, before any
	// build notices.
	clk.Step(10 * time.Second)
	instance, _, err = h.mainChoice(rg, gvk, obj("x"), "a")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(instance).To(BeEmpty())

	// A deleted Lease: not ready from its deletion on.
	clk.SetTime(now)
	g.Expect(builds.ready("r", "a", now)).To(BeTrue())
	builds.leaseChanged(lease("a", "a"), nil)
	g.Expect(builds.ready("r", "a", now)).To(BeFalse())
}

// TestNoRingBuildForSlots checks that a ring of unit Slots gets no ring
// builder and no membership at admission (its objects' slots need none),
// and that one of unit Objects replaced under its name by one of unit
// Slots, its deletion unseen, loses its builder and members.
func TestNoRingBuildForSlots(t *testing.T) {
	g := NewWithT(t)
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	clk := clocktesting.NewFakeClock(now)
	rings := &ringbuilds.Builds{}
	builds := newRingBuilds(nil, rings, clk, logr.Discard(), func() bool { return false })
	t.Cleanup(builds.cancel)
	slotRing := func(name, uid string) *v1alpha1.ControllerRing {
		return &v1alpha1.ControllerRing{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(uid)}, Spec: v1alpha1.ControllerRingSpec{
			LeaseNamespace: "ns", Assignment: &v1alpha1.RingAssignment{Unit: v1alpha1.AssignmentUnitSlots}}}
	}
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a", Labels: map[string]string{v1alpha1.LabelRing: "s"}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("a"), LeaseDurationSeconds: ptr.To[int32](10),
			RenewTime: ptr.To(metav1.NewMicroTime(now))},
	}

	builds.ringChanged(nil, slotRing("s", "1"))
	builds.leaseChanged(nil, lease)
	g.Expect(builds.ring("s")).To(BeNil(), "no builder for a ring of unit Slots")
	g.Expect(builds.built("s")).To(BeNil())
	g.Expect(builds.ready("s", "a", now)).To(BeFalse(), "no members tracked")

	objects := &v1alpha1.ControllerRing{ObjectMeta: metav1.ObjectMeta{Name: "o", UID: "2"}, Spec: v1alpha1.ControllerRingSpec{LeaseNamespace: "ns"}}
	builds.ringChanged(nil, objects)
	g.Expect(builds.ring("o")).NotTo(BeNil(), "a ring of unit Objects has a builder")
	onO := lease.DeepCopy()
	onO.Labels[v1alpha1.LabelRing] = "o"
	builds.leaseChanged(nil, onO)
	g.Expect(builds.ready("o", "a", now)).To(BeTrue())
	builds.ringChanged(objects, slotRing("o", "3"))
	g.Expect(builds.ring("o")).To(BeNil(), "the builder of the replaced ring is stopped")
	g.Expect(builds.ready("o", "a", now)).To(BeFalse(), "its members are forgotten")
}
