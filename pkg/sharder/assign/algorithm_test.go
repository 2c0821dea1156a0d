package assign_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/ring"
	"github.com/sharder-dev/sharder/pkg/sharder/assign"
	"github.com/sharder-dev/sharder/pkg/sharder/leasecontroller"
)

// unregistered is an algorithm name no sharder in these tests registers.
const unregistered = "not-built-in"

// setAlgorithm changes the ring's spec.algorithm.
func setAlgorithm(g Gomega, name, algorithm string) {
	r := getRing(g, name)
	patch := client.MergeFrom(r.DeepCopy())
	r.Spec.Algorithm = algorithm
	g.Expect(env().Client.Patch(context.Background(), r, patch)).To(Succeed())
}

// expectUnknownAlgorithm waits for the ring to report, for its current
// generation, that the sharder does not know its algorithm.
func expectUnknownAlgorithm(g Gomega, name string) {
	g.Eventually(func(g Gomega) {
		r := getRing(g, name)
		g.Expect(r.Status.ObservedGeneration).To(Equal(r.Generation))
		cond := meta.FindStatusCondition(r.Status.Conditions, v1alpha1.ConditionReady)
		g.Expect(cond).NotTo(BeNil())
		g.Expect(cond.Status).To(Equal(metav1.ConditionFalse))
		g.Expect(cond.Reason).To(Equal(v1alpha1.ReasonUnknownAlgorithm))
		g.Expect(cond.ObservedGeneration).To(Equal(r.Generation))
		g.Expect(cond.Message).To(And(ContainSubstring(`"`+unregistered+`"`), ContainSubstring("ring.Register")))
	}, timeout, poll).Should(Succeed())
}

// TestUnknownAlgorithm runs one sharder with two rings: one names an
// algorithm the sharder was not built with, the other a built-in one. The
// first is not ready with reason UnknownAlgorithm and its objects are
// neither assigned nor moved, whatever the membership does; the second is
// assigned as usual. Naming a known algorithm later starts the ring.
func TestUnknownAlgorithm(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	unknown, known := env().Namespace(t), env().Namespace(t)
	ready := []string{"a", "b"}
	reg := leasecontroller.NewRegistry()
	reg.Set(unknown, members(membership.StateReady, ready...))
	reg.Set(known, members(membership.StateReady, ready...))

	// Objects of the unknown ring: some already on "a", of which a working
	// ring would move those it hashes to "b", and some unassigned.
	// Chosen so that a working ring has work in both steps below, whatever
	// the namespace's random name: one object it moves to "b", one it moves
	// to "c" once "c" joins.
	grown := []string{"a", "b", "c"}
	pick := func(want string, members []string) string {
		for i := 0; ; i++ {
			if name := fmt.Sprintf("cm-%d", i); expected(t, members, unknown, name) == want {
				return name
			}
		}
	}
	onA := []string{pick("b", ready)}
	if toC := pick("c", grown); toC != onA[0] {
		onA = append(onA, toC)
	}
	for i := 0; len(onA) < 8; i++ {
		if name := fmt.Sprintf("cm-%d", i); !slices.Contains(onA, name) {
			onA = append(onA, name)
		}
	}
	for _, name := range onA {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: unknown, Name: name,
			Labels: map[string]string{v1alpha1.ShardLabel(unknown): "a"}}}
		g.Expect(env().Client.Create(ctx, cm)).To(Succeed())
	}
	unassigned := createConfigMaps(t, unknown, "new", 4)
	wouldMove := 0
	for _, name := range onA {
		if expected(t, ready, unknown, name) == "b" {
			wouldMove++
		}
	}
	g.Expect(wouldMove).To(BeNumerically(">", 0), "a working ring moves some of the objects on a")
	initial := labelsOf(g, unknown)

	newRing(t, unknown, func(s *v1alpha1.ControllerRingSpec) { s.Algorithm = unregistered })
	newRing(t, known, nil)
	knownNames := createConfigMaps(t, known, "cm", 10)
	startSharder(t, reg, assign.Options{})

	// The other ring works.
	g.Eventually(func(g Gomega) {
		got := labelsOf(g, known)
		for _, name := range knownNames {
			g.Expect(got[name]).To(HaveKeyWithValue(v1alpha1.ShardLabel(known), expected(t, ready, known, name)), name)
		}
	}, timeout, poll).Should(Succeed())
	expectUnknownAlgorithm(g, unknown)
	g.Consistently(func(g Gomega) {
		g.Expect(labelsOf(g, unknown)).To(Equal(initial))
	}, 2*time.Second, 100*time.Millisecond).Should(Succeed(), "nothing of the unknown ring is assigned or drained")

	// A known algorithm starts the ring: the objects are assigned and moved.
	acknowledger(t, unknown, unknown, func(string) bool { return true })
	setAlgorithm(g, unknown, v1alpha1.AlgorithmConsistentHash)
	g.Eventually(func(g Gomega) {
		got := labelsOf(g, unknown)
		for _, name := range append(onA, unassigned...) {
			g.Expect(got[name]).To(HaveKeyWithValue(v1alpha1.ShardLabel(unknown), expected(t, ready, unknown, name)), name)
			g.Expect(got[name]).NotTo(HaveKey(v1alpha1.DrainLabel(unknown)), name)
		}
		r := getRing(g, unknown)
		g.Expect(meta.IsStatusConditionTrue(r.Status.Conditions, v1alpha1.ConditionReady)).To(BeTrue())
	}, timeout, poll).Should(Succeed())

	// Back to an unknown algorithm, the running ring stops: a new instance
	// that would take objects gets none.
	assigned := labelsOf(g, unknown)
	setAlgorithm(g, unknown, unregistered)
	expectUnknownAlgorithm(g, unknown)
	toC := 0
	for name := range assigned {
		if expected(t, grown, unknown, name) == "c" {
			toC++
		}
	}
	g.Expect(toC).To(BeNumerically(">", 0), "a working ring moves some objects to c")
	acknowledger(t, known, known, func(string) bool { return true })
	reg.Set(unknown, members(membership.StateReady, grown...))
	reg.Set(known, members(membership.StateReady, grown...))
	g.Eventually(func(g Gomega) {
		got := labelsOf(g, known)
		for _, name := range knownNames {
			g.Expect(got[name]).To(HaveKeyWithValue(v1alpha1.ShardLabel(known), expected(t, grown, known, name)), name)
			g.Expect(got[name]).NotTo(HaveKey(v1alpha1.DrainLabel(known)), name)
		}
	}, timeout, poll).Should(Succeed(), "the other ring still rebalances")
	g.Consistently(func(g Gomega) {
		g.Expect(labelsOf(g, unknown)).To(Equal(assigned))
	}, 2*time.Second, 100*time.Millisecond).Should(Succeed(), "nothing of the unknown ring moves")
}

// TestAlgorithmNameIsValidated: the API server admits any name an algorithm
// can be registered under and rejects what cannot be one.
func TestAlgorithmNameIsValidated(t *testing.T) {
	ctx := context.Background()
	for name, want := range map[string]bool{
		"by-namespace":      true,
		"example.com.zone":  true,
		ring.ConsistentHash: true,
		"By-Namespace":      false,
		"by_namespace":      false,
		"-leading-dash":     false,
		"a-name-longer-than-sixty-three-characters-is-not-accepted-by-the-api": false,
	} {
		t.Run(name, func(t *testing.T) {
			r := &v1alpha1.ControllerRing{
				ObjectMeta: metav1.ObjectMeta{GenerateName: "algorithm-"},
				Spec: v1alpha1.ControllerRingSpec{
					LeaseNamespace: "default",
					Resources:      []v1alpha1.RingResource{{Resource: "configmaps"}},
					Algorithm:      name,
				},
			}
			err := env().Client.Create(ctx, r, client.DryRunAll)
			if want && err != nil {
				t.Fatalf("algorithm %q rejected: %v", name, err)
			}
			if !want && !apierrors.IsInvalid(err) {
				t.Fatalf("algorithm %q: got %v, want Invalid", name, err)
			}
		})
	}
}
