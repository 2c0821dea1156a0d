package assign_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/sharder/assign"
	"github.com/sharder-dev/sharder/pkg/sharder/leasecontroller"
	"github.com/sharder-dev/sharder/pkg/sharder/metrics"
)

// TestDrainTimeoutSurvivesALeaderChange: a sharder elected while drains are
// in flight counts their timeout from the start the previous leader wrote
// on each object, not from its own start, so a rollout of the sharder does
// not restart every drainTimeout; the start goes with the drain.
func TestDrainTimeoutSurvivesALeaderChange(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	const drainTimeout = 30 * time.Second
	reg := leasecontroller.NewRegistry()
	reg.Set(ns, members(membership.StateReady, "a"))
	newRing(t, ns, func(s *v1alpha1.ControllerRingSpec) { s.DrainTimeout = &metav1.Duration{Duration: drainTimeout} })
	names := createConfigMaps(t, ns, "cm", 20)
	start := time.Now().Truncate(time.Millisecond)
	first := clocktesting.NewFakeClock(start)
	stopFirst := startSharder(t, reg, assign.Options{Clock: first})
	g.Eventually(assigned(ns, names, on("a")), timeout, poll).Should(Succeed())

	reg.Set(ns, members(membership.StateReady, "a", "b"))
	var toB []string
	for _, name := range names {
		if expected(t, []string{"a", "b"}, ns, name) == "b" {
			toB = append(toB, name)
		}
	}
	g.Expect(toB).NotTo(BeEmpty())
	startKey := v1alpha1.DrainStartedAnnotation(ns)
	onAWithDrain := func(g Gomega) {
		got := metadataOf(g, ns)
		for _, name := range toB {
			g.Expect(got[name].Labels).To(HaveKeyWithValue(v1alpha1.ShardLabel(ns), "a"), name)
			g.Expect(got[name].Labels).To(HaveKey(v1alpha1.DrainLabel(ns)), name)
			g.Expect(got[name].Annotations).To(HaveKeyWithValue(startKey, v1alpha1.FormatDrainStarted(start)),
				"%s: the drain's start is written with it", name)
		}
	}
	g.Eventually(onAWithDrain, timeout, poll).Should(Succeed())
	g.Eventually(func() float64 { return testutil.ToFloat64(metrics.DrainsTotal.WithLabelValues(ns)) }, timeout, poll).
		Should(BeEquivalentTo(len(toB)))
	stopFirst()

	// A new leader, 20 s later by its clock: 10 s of the timeout are left.
	second := clocktesting.NewFakeClock(start.Add(20 * time.Second))
	reg2 := leasecontroller.NewRegistry()
	reg2.Set(ns, members(membership.StateReady, "a", "b"))
	startSharder(t, reg2, assign.Options{Clock: second})
	// A new object assigned proves the new sharder synced and decided.
	fresh := createConfigMaps(t, ns, "fresh", 1)[0]
	g.Eventually(func(g Gomega) {
		g.Expect(labelsOf(g, ns)[fresh]).To(HaveKey(v1alpha1.ShardLabel(ns)))
	}, timeout, poll).Should(Succeed())
	second.Step(9 * time.Second)
	g.Consistently(onAWithDrain, time.Second, poll).Should(Succeed(), "forced before the drain timed out")

	second.Step(time.Second)
	g.Eventually(func(g Gomega) {
		got := labelsOf(g, ns)
		for _, name := range toB {
			g.Expect(got[name]).NotTo(HaveKey(v1alpha1.ShardLabel(ns)), "%s: released when the written timeout ended", name)
		}
	}, timeout, poll).Should(Succeed())
	g.Eventually(func(g Gomega) {
		second.Step(10 * time.Millisecond) // through the release grace, and any retry's backoff
		got := metadataOf(g, ns)
		for _, name := range toB {
			g.Expect(got[name].Labels).To(HaveKeyWithValue(v1alpha1.ShardLabel(ns), "b"), name)
			g.Expect(got[name].Labels).NotTo(HaveKey(v1alpha1.DrainLabel(ns)), name)
			g.Expect(got[name].Annotations).NotTo(HaveKey(startKey), "%s: the start goes with the drain", name)
		}
	}, timeout, poll).Should(Succeed())
}

// metadataOf returns the metadata of every ConfigMap in ns by name.
func metadataOf(g Gomega, ns string) map[string]metav1.ObjectMeta {
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("ConfigMapList"))
	g.Expect(env().Client.List(context.Background(), list, client.InNamespace(ns))).To(Succeed())
	out := map[string]metav1.ObjectMeta{}
	for _, o := range list.Items {
		out[o.Name] = o.ObjectMeta
	}
	return out
}
