package slotlabel_test

import (
	"context"
	"strconv"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/metadata"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/sharder/assign/slotlabel"
	"github.com/sharder-dev/sharder/pkg/slots"
)

// TestMainObjectsGetTheirSlot: ConfigMaps of the ring's namespace, created
// before the labeler started and after, with a name or a generated one,
// get the slot slots.ForMainObject computes, once. An object that carries a
// slot label already, even a wrong one, is not written; nor is an object
// being deleted, nor any object of a namespace the ring does not select.
func TestMainObjectsGetTheirSlot(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ctx := context.Background()
	ns, other := env().Namespace(t), env().Namespace(t)
	ring := newRing(ns, nil)
	selectNamespace(t, ns, ns)
	slotLabel := v1alpha1.SlotLabel(ns)

	old := []string{"old-0", "old-1", "old-2", "old-3", "old-4"}
	for _, name := range old {
		create(t, configMap(ns, name, nil))
	}
	wrong := otherSlot(ring, mainSlot(ring, ns, "wrong"))
	create(t, configMap(ns, "wrong", map[string]string{slotLabel: wrong}))
	deleting := configMap(ns, "deleting", nil)
	deleting.Finalizers = []string{"slotlabel-test.sharder.dev/hold"}
	create(t, deleting)
	g.Expect(env().Client.Delete(ctx, deleting)).To(Succeed())
	t.Cleanup(func() {
		_ = env().Client.Patch(context.Background(), deleting, client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"finalizers":null}}`)))
	})
	create(t, configMap(other, "elsewhere", nil))
	wrongRV := resourceVersion(g, "ConfigMap", ns, "wrong")

	l, _ := startLabeler(t, ring, nil)

	isLabelled := func(names ...string) func(Gomega) {
		return func(g Gomega) {
			for _, name := range names {
				g.Expect(slotOf(g, ns, "ConfigMap", ns, name)).To(Equal(mainSlot(ring, ns, name)), name)
			}
		}
	}
	g.Eventually(isLabelled(old...), timeout, poll).Should(Succeed(), "objects that existed at the start")

	fresh := []string{"new-0", "new-1", "new-2"}
	for _, name := range fresh {
		create(t, configMap(ns, name, nil))
	}
	generated := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "gen-"}}
	create(t, generated)
	g.Eventually(isLabelled(append(fresh, generated.Name)...), timeout, poll).Should(Succeed(), "objects created since")
	g.Eventually(l.Unlabelled, timeout, poll).Should(Equal(1), "only the object being deleted is left")

	g.Consistently(func(g Gomega) {
		got := read(g, "ConfigMap", ns, "wrong")
		g.Expect(got.Labels).To(HaveKeyWithValue(slotLabel, wrong), "a slot label is never rewritten")
		g.Expect(got.ResourceVersion).To(Equal(strconv.FormatInt(wrongRV, 10)), "a labelled object is not written at all")
		g.Expect(read(g, "ConfigMap", ns, "deleting").Labels).NotTo(HaveKey(slotLabel), "an object being deleted is left alone")
		g.Expect(read(g, "ConfigMap", other, "elsewhere").Labels).NotTo(HaveKey(slotLabel), "another namespace is left alone")
		for _, name := range old {
			g.Expect(slotOf(g, ns, "ConfigMap", ns, name)).To(Equal(mainSlot(ring, ns, name)))
		}
	}, quiet, poll).Should(Succeed())
}

// TestControlledObjectsTakeTheirControllersSlot: a Secret controlled by a
// ConfigMap, and one controlled by such a Secret, carry the ConfigMap's
// slot, written before the ConfigMap's own (children first), whether they
// existed before the labeler started, were created after their controller
// was labelled (its label read from the API server), or waited for their
// namespace to be selected. A child copies its controller's label even when
// that label is not the slot the controller's key gives. Objects whose
// chain leaves the ring, loops or names a controller that is gone are left
// without a slot and reported.
func TestControlledObjectsTakeTheirControllersSlot(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ctx := context.Background()
	ns, late := env().Namespace(t), env().Namespace(t)
	ring := newRing(ns, nil)
	selectNamespace(t, ns, ns)
	slotLabel := v1alpha1.SlotLabel(ns)

	// A tree that exists before the labeler starts.
	m1 := configMap(ns, "m1", nil)
	create(t, m1)
	s1 := secretOf("s1", "ConfigMap", m1)
	create(t, s1)
	s2 := secretOf("s2", "Secret", s1)
	create(t, s2)
	// A tree in a namespace the ring selects only later: the child exists
	// long before its controller is labelled.
	m2 := configMap(late, "m2", nil)
	create(t, m2)
	c2 := secretOf("c2", "ConfigMap", m2)
	create(t, c2)
	// Objects that are not of the ring, or cannot be.
	create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "orphan"}})
	create(t, secretOf("foreign", "ServiceAccount", &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "some-sa", UID: "sa-uid"}}))
	nothere := configMap(ns, "nothere", nil)
	nothere.UID = "gone-uid"
	create(t, secretOf("lost", "ConfigMap", nothere))
	loopA := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "loop-a"}}
	create(t, loopA)
	loopB := secretOf("loop-b", "Secret", loopA)
	create(t, loopB)
	loopA.OwnerReferences = secretOf("", "Secret", loopB).OwnerReferences
	g.Expect(env().Client.Update(ctx, loopA)).To(Succeed())

	_, rec := startLabeler(t, ring, nil)

	want1 := mainSlot(ring, ns, "m1")
	g.Eventually(func(g Gomega) {
		for _, o := range []struct{ kind, name string }{{"ConfigMap", "m1"}, {"Secret", "s1"}, {"Secret", "s2"}} {
			g.Expect(slotOf(g, ns, o.kind, ns, o.name)).To(Equal(want1), o.name)
		}
	}, timeout, poll).Should(Succeed())
	owner := resourceVersion(g, "ConfigMap", ns, "m1")
	g.Expect(resourceVersion(g, "Secret", ns, "s1")).To(BeNumerically("<", owner), "the child is labelled before its controller")
	g.Expect(resourceVersion(g, "Secret", ns, "s2")).To(BeNumerically("<", owner), "the grandchild is labelled before the main object")

	// A child of a controller labelled already: its label is read from the
	// API server.
	create(t, secretOf("s3", "ConfigMap", m1))
	// A controller created with a slot label its key does not give: its
	// child takes the label, not the key's slot.
	odd := otherSlot(ring, mainSlot(ring, ns, "w"))
	w := configMap(ns, "w", map[string]string{slotLabel: odd})
	create(t, w)
	create(t, secretOf("wc", "ConfigMap", w))
	// A controller and child created together while the labeler runs.
	m4 := configMap(ns, "m4", nil)
	create(t, m4)
	create(t, secretOf("s4", "ConfigMap", m4))
	g.Eventually(func(g Gomega) {
		g.Expect(slotOf(g, ns, "Secret", ns, "s3")).To(Equal(want1))
		g.Expect(slotOf(g, ns, "Secret", ns, "wc")).To(Equal(odd))
		g.Expect(slotOf(g, ns, "Secret", ns, "s4")).To(Equal(mainSlot(ring, ns, "m4")))
		g.Expect(slotOf(g, ns, "ConfigMap", ns, "m4")).To(Equal(mainSlot(ring, ns, "m4")))
	}, timeout, poll).Should(Succeed())

	g.Eventually(rec.recorded, timeout, poll).Should(And(
		hasEvent(slotlabel.ReasonControllerNotInRing, "some-sa"),
		hasEvent(slotlabel.ReasonControllerNotFound, "nothere"),
		hasEvent(slotlabel.ReasonOwnershipCycle, "loop-"),
	))
	g.Consistently(func(g Gomega) {
		for _, name := range []string{"orphan", "foreign", "lost", "loop-a", "loop-b"} {
			g.Expect(read(g, "Secret", ns, name).Labels).NotTo(HaveKey(slotLabel), name)
		}
		g.Expect(read(g, "ConfigMap", late, "m2").Labels).NotTo(HaveKey(slotLabel))
		g.Expect(read(g, "Secret", late, "c2").Labels).NotTo(HaveKey(slotLabel))
	}, quiet, poll).Should(Succeed(), "objects left without a slot, and a namespace not selected yet")

	selectNamespace(t, ns, late)
	want2 := mainSlot(ring, late, "m2")
	g.Eventually(func(g Gomega) {
		g.Expect(slotOf(g, ns, "ConfigMap", late, "m2")).To(Equal(want2))
		g.Expect(slotOf(g, ns, "Secret", late, "c2")).To(Equal(want2))
	}, timeout, poll).Should(Succeed(), "the namespace's objects once it is selected")
	g.Expect(resourceVersion(g, "Secret", late, "c2")).To(BeNumerically("<", resourceVersion(g, "ConfigMap", late, "m2")))
}

// TestNamespaceKey: in a ring of key Namespace every main object of a
// namespace gets the slot of the namespace's FNV-1a hash, and its
// controlled objects the same.
func TestNamespaceKey(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	a, b := env().Namespace(t), env().Namespace(t)
	ring := newRing(a, func(s *v1alpha1.ControllerRingSpec) {
		s.Assignment.Slots = &v1alpha1.RingSlots{Count: 16, Key: v1alpha1.SlotKeyNamespace}
	})
	selectNamespace(t, a, a)
	selectNamespace(t, a, b)
	for _, ns := range []string{a, b} {
		for _, name := range []string{"x", "y", "z"} {
			cm := configMap(ns, name, nil)
			create(t, cm)
			create(t, secretOf(name+"-child", "ConfigMap", cm))
		}
	}
	// Watched in the two namespaces alone, as for a ring that names them.
	startLabeler(t, ring, func(o *slotlabel.Options) { o.Namespaces = []string{a, b} })
	g.Eventually(func(g Gomega) {
		for _, ns := range []string{a, b} {
			want := mainSlot(ring, ns, "x")
			g.Expect(want).To(Equal(strconv.Itoa(slots.ForNamespace(ns, 16))))
			for _, name := range []string{"x", "y", "z"} {
				g.Expect(slotOf(g, a, "ConfigMap", ns, name)).To(Equal(want), name)
				g.Expect(slotOf(g, a, "Secret", ns, name+"-child")).To(Equal(want), name+"-child")
			}
		}
	}, timeout, poll).Should(Succeed())
}

// TestConflictIsDecidedAgain: a write decided on a version of the object
// someone changed since fails with a conflict, for a main object and for a
// controlled one, and the object is labelled from the cache's newer
// version, keeping the other writer's change.
func TestConflictIsDecidedAgain(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ns := env().Namespace(t)
	ring := newRing(ns, nil)
	selectNamespace(t, ns, ns)
	m := configMap(ns, "m", nil)
	create(t, m)
	create(t, secretOf("c", "ConfigMap", m))
	mc, err := metadata.NewForConfig(env().Config)
	if err != nil {
		t.Fatal(err)
	}
	writer := &interfering{Interface: mc, touched: map[string]bool{}, attempts: map[string]int{}}
	startLabeler(t, ring, func(o *slotlabel.Options) { o.Writer = writer })
	want := mainSlot(ring, ns, "m")
	g.Eventually(func(g Gomega) {
		for _, o := range []struct{ kind, name string }{{"ConfigMap", "m"}, {"Secret", "c"}} {
			got := read(g, o.kind, ns, o.name)
			g.Expect(got.Labels).To(HaveKeyWithValue(v1alpha1.SlotLabel(ns), want), o.name)
			g.Expect(got.Annotations).To(HaveKeyWithValue("slotlabel-test.sharder.dev/touched", "yes"), o.name)
		}
	}, timeout, poll).Should(Succeed())
	g.Expect(writer.attemptsOf("configmaps/"+ns+"/m")).To(BeNumerically(">=", 2), "the first write conflicted")
	g.Expect(writer.attemptsOf("secrets/"+ns+"/c")).To(BeNumerically(">=", 2), "the first write conflicted")
}

// TestNew refuses a ring that is not of unit Slots and options that lack
// what the labeler needs.
func TestNew(t *testing.T) {
	mc, err := metadata.NewForConfig(env().Config)
	if err != nil {
		t.Fatal(err)
	}
	ring := newRing("ring", nil)
	objects := newRing("ring", func(s *v1alpha1.ControllerRingSpec) { s.Assignment = nil })
	for name, opts := range map[string]slotlabel.Options{
		"no ring":   {Client: mc, Mapper: env().Client.RESTMapper()},
		"objects":   {Ring: objects, Client: mc, Mapper: env().Client.RESTMapper()},
		"no client": {Ring: ring, Mapper: env().Client.RESTMapper()},
		"no mapper": {Ring: ring, Client: mc},
		"bad selector": {Ring: newRing("ring", func(s *v1alpha1.ControllerRingSpec) {
			s.NamespaceSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "k", Operator: "Nope"}}}
		}), Client: mc, Mapper: env().Client.RESTMapper()},
	} {
		if _, err := slotlabel.New(opts); err == nil {
			t.Errorf("%s: New accepted it", name)
		}
	}
	// A resource the API server does not serve is reported, the others are
	// labelled.
	missing := newRing("ring", func(s *v1alpha1.ControllerRingSpec) {
		s.Resources = append(s.Resources, v1alpha1.RingResource{Group: "example.dev", Resource: "nothings"})
	})
	l, err := slotlabel.New(slotlabel.Options{Ring: missing, Client: mc, Mapper: env().Client.RESTMapper()})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if p := l.Problems(); len(p) != 1 || p[0].Reason != v1alpha1.ReasonResourceNotServed {
		t.Errorf("Problems = %+v, want the resource not served", p)
	}
}
