package assign_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/drain"
	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/sharder/assign"
	"github.com/sharder-dev/sharder/pkg/sharder/leasecontroller"
	"github.com/sharder-dev/sharder/pkg/sharder/metrics"
)

const (
	timeout = 20 * time.Second
	poll    = 50 * time.Millisecond
)

func TestAssignsExistingAndNewObjects(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	existing := createConfigMaps(t, ns, "old", 30)
	reg := leasecontroller.NewRegistry()
	reg.Set(ns, members(membership.StateReady, "a", "b", "c"))
	ready := []string{"a", "b", "c"}
	newRing(t, ns, nil)
	startSharder(t, reg, assign.Options{})

	g.Eventually(assigned(ns, existing, placed(t, ns, ready...)), timeout, poll).Should(Succeed())

	fresh := createConfigMaps(t, ns, "new", 10)
	g.Eventually(assigned(ns, fresh, placed(t, ns, ready...)), timeout, poll).Should(Succeed())

	g.Eventually(func(g Gomega) {
		r := getRing(g, ns)
		g.Expect(r.Status.ObservedGeneration).To(Equal(r.Generation))
		g.Expect(meta.IsStatusConditionTrue(r.Status.Conditions, v1alpha1.ConditionReady)).To(BeTrue())
		g.Expect(r.Status.Instances).To(BeEquivalentTo(3))
		g.Expect(r.Status.AvailableInstances).To(BeEquivalentTo(3))
		g.Expect(r.Status.Objects).To(BeEquivalentTo(len(existing) + len(fresh)))
		g.Expect(r.Status.UnassignedObjects).To(BeZero())
		var sum int32
		for _, m := range r.Status.Members {
			g.Expect(m.State).To(Equal("ready"))
			sum += m.Objects
		}
		g.Expect(sum).To(BeEquivalentTo(len(existing) + len(fresh)))
	}, timeout, poll).Should(Succeed())
}

func TestNothingAssignedWithoutReadyInstance(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	reg := leasecontroller.NewRegistry()
	reg.Set(ns, members(membership.StateExpired, "a"))
	newRing(t, ns, nil)
	startSharder(t, reg, assign.Options{})
	names := createConfigMaps(t, ns, "cm", 5)

	g.Eventually(func(g Gomega) {
		r := getRing(g, ns)
		cond := meta.FindStatusCondition(r.Status.Conditions, v1alpha1.ConditionReady)
		g.Expect(cond).NotTo(BeNil())
		g.Expect(cond.Reason).To(Equal(v1alpha1.ReasonNoReadyInstances))
		g.Expect(r.Status.UnassignedObjects).To(BeEquivalentTo(5))
	}, timeout, poll).Should(Succeed())
	g.Consistently(func(g Gomega) {
		for _, l := range labelsOf(g, ns) {
			g.Expect(l).NotTo(HaveKey(v1alpha1.ShardLabel(ns)))
		}
	}, time.Second, 100*time.Millisecond).Should(Succeed())

	// The instance comes back: everything goes to it.
	reg.Set(ns, members(membership.StateReady, "a"))
	g.Eventually(assigned(ns, names, on("a")), timeout, poll).Should(Succeed())
}

func TestExpiredInstanceKeepsObjectsButGetsNoNewOnes(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	reg := leasecontroller.NewRegistry()
	reg.Set(ns, members(membership.StateReady, "a", "b"))
	newRing(t, ns, nil)
	startSharder(t, reg, assign.Options{})
	old := createConfigMaps(t, ns, "old", 20)
	var onB []string
	g.Eventually(func(g Gomega) {
		onB = nil
		got := labelsOf(g, ns)
		for _, name := range old {
			want := expected(t, []string{"a", "b"}, ns, name)
			g.Expect(got[name]).To(HaveKeyWithValue(v1alpha1.ShardLabel(ns), want))
			if want == "b" {
				onB = append(onB, name)
			}
		}
	}, timeout, poll).Should(Succeed())
	g.Expect(onB).NotTo(BeEmpty())

	reg.Set(ns, append(members(membership.StateReady, "a"), members(membership.StateExpired, "b")...))
	fresh := createConfigMaps(t, ns, "new", 20)
	g.Eventually(assigned(ns, fresh, on("a")), timeout, poll).Should(Succeed())
	got := labelsOf(g, ns)
	for _, name := range onB {
		g.Expect(got[name]).To(HaveKeyWithValue(v1alpha1.ShardLabel(ns), "b"), "objects of an expired instance stay")
		g.Expect(got[name]).NotTo(HaveKey(v1alpha1.DrainLabel(ns)), "objects of an expired instance are not drained")
	}
}

// TestScaleOutHandsOverInTwoWrites: a move from a ready instance costs two
// writes. The sharder's drain request names the new instance, and the
// acknowledgement hands the object over to it: owner, then owner with the
// drain naming the target, then the target, never without a shard label
// and without the sharder writing in between.
func TestScaleOutHandsOverInTwoWrites(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	reg := leasecontroller.NewRegistry()
	reg.Set(ns, members(membership.StateReady, "a", "b"))
	newRing(t, ns, nil)
	names := createConfigMaps(t, ns, "cm", 60)
	startSharder(t, reg, assign.Options{})
	g.Eventually(assigned(ns, names, placed(t, ns, "a", "b")), timeout, poll).Should(Succeed())

	h := watchHistory(t, configMaps, ns, ns)
	acknowledger(t, ns, ns, func(string) bool { return true })
	reg.Set(ns, members(membership.StateReady, "a", "b", "c"))

	after := []string{"a", "b", "c"}
	expectMoves(g, t, h, ns, names, []string{"a", "b"}, after, func(before, now string) []string {
		return []string{before + "/-", before + "/" + now, now + "/-"}
	})
}

// TestLegacyAcknowledgementIsAssigned: an instance that acknowledges as
// before the hand-over, removing both labels whatever the drain names, still
// gets its objects moved: the sharder assigns them.
func TestLegacyAcknowledgementIsAssigned(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	reg := leasecontroller.NewRegistry()
	reg.Set(ns, members(membership.StateReady, "a", "b"))
	newRing(t, ns, nil)
	names := createConfigMaps(t, ns, "cm", 60)
	startSharder(t, reg, assign.Options{})
	g.Eventually(assigned(ns, names, placed(t, ns, "a", "b")), timeout, poll).Should(Succeed())

	h := watchHistory(t, configMaps, ns, ns)
	acknowledgerWith(t, ns, ns, func(string) bool { return true }, legacyAcknowledge)
	reg.Set(ns, members(membership.StateReady, "a", "b", "c"))

	after := []string{"a", "b", "c"}
	expectMoves(g, t, h, ns, names, []string{"a", "b"}, after, func(before, now string) []string {
		return []string{before + "/-", before + "/" + now, "/-", now + "/-"}
	})
}

// TestDrainFollowsTheTarget: while a drain waits for its acknowledgement,
// the instance it names leaves and another joins. The sharder makes every
// drain name the object's current target (or withdraws it), so the
// acknowledgements hand the objects over to the right instance at once.
func TestDrainFollowsTheTarget(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	reg := leasecontroller.NewRegistry()
	abc, abd := []string{"a", "b", "c"}, []string{"a", "b", "d"}
	reg.Set(ns, members(membership.StateReady, "a", "b"))
	newRing(t, ns, nil)
	names := createConfigMaps(t, ns, "cm", 80)
	startSharder(t, reg, assign.Options{})
	g.Eventually(assigned(ns, names, placed(t, ns, "a", "b")), timeout, poll).Should(Succeed())
	h := watchHistory(t, configMaps, ns, ns)

	// c joins: the drains name it; nobody acknowledges yet.
	reg.Set(ns, members(membership.StateReady, abc...))
	draining := func(ready []string) func(Gomega) {
		return func(g Gomega) {
			got := labelsOf(g, ns)
			for _, name := range names {
				from := expected(t, []string{"a", "b"}, ns, name)
				if to := expected(t, ready, ns, name); to != from {
					g.Expect(got[name]).To(HaveKeyWithValue(v1alpha1.DrainLabel(ns), to), name)
				} else {
					g.Expect(got[name]).NotTo(HaveKey(v1alpha1.DrainLabel(ns)), name)
				}
			}
		}
	}
	g.Eventually(draining(abc), timeout, poll).Should(Succeed())

	// c dies before any acknowledgement, d joins.
	reg.Set(ns, append(members(membership.StateReady, abd...), members(membership.StateDead, "c")...))
	g.Eventually(draining(abd), timeout, poll).Should(Succeed())

	acknowledger(t, ns, ns, func(string) bool { return true })
	g.Eventually(assigned(ns, names, placed(t, ns, abd...)), timeout, poll).Should(Succeed())
	retargeted := 0
	for _, name := range names {
		from, viaC, to := expected(t, []string{"a", "b"}, ns, name), expected(t, abc, ns, name), expected(t, abd, ns, name)
		var want []string
		switch {
		case viaC == from && to == from:
			want = []string{from + "/-"}
		case viaC == from:
			want = []string{from + "/-", from + "/" + to, to + "/-"}
		case to == from:
			want = []string{from + "/-", from + "/" + viaC, from + "/-"}
		default:
			retargeted++
			want = []string{from + "/-", from + "/" + viaC, from + "/" + to, to + "/-"}
		}
		g.Eventually(func() []string { return h.states(name) }, timeout, poll).Should(Equal(want), name)
	}
	g.Expect(retargeted).To(BeNumerically(">", 0))
}

// expectMoves waits until every object of names is on its instance of the
// ring of the ready instances after, without a drain label, and checks the
// label states each went through (shard/drain value, "-" for no drain
// label): none for those that stay, want(before, now) for those that move.
func expectMoves(g Gomega, t *testing.T, h *history, ns string, names, before, after []string, want func(before, now string) []string) {
	t.Helper()
	g.Eventually(func(g Gomega) {
		got := labelsOf(g, ns)
		for _, name := range names {
			g.Expect(got[name]).To(HaveKeyWithValue(v1alpha1.ShardLabel(ns), expected(t, after, ns, name)))
			g.Expect(got[name]).NotTo(HaveKey(v1alpha1.DrainLabel(ns)))
		}
	}, timeout, poll).Should(Succeed())

	moved := 0
	for _, name := range names {
		from, to := expected(t, before, ns, name), expected(t, after, ns, name)
		if from == to {
			g.Expect(h.drained(name)).To(BeFalse(), "%s stays on %s and must not be drained", name, to)
			continue
		}
		moved++
		g.Expect(to).To(Equal("c"), "adding an instance only moves objects to it")
		// The watch may lag behind the list above.
		g.Eventually(func() []string { return h.states(name) }, timeout, poll).Should(Equal(want(from, to)), name)
	}
	g.Expect(moved).To(BeNumerically(">", 0))
}

// TestHandOverToAGoneTargetIsCorrected: the instance a drain names is dead by
// the time the acknowledgement hands the object over to it; the sharder moves
// the object on at once, as any object of a dead instance.
func TestHandOverToAGoneTargetIsCorrected(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := env().Namespace(t)
	reg := leasecontroller.NewRegistry()
	reg.Set(ns, members(membership.StateReady, "a", "b"))
	newRing(t, ns, nil)
	names := createConfigMaps(t, ns, "cm", 60)
	stop := startSharder(t, reg, assign.Options{})
	two, three := []string{"a", "b"}, []string{"a", "b", "c"}
	g.Eventually(assigned(ns, names, placed(t, ns, two...)), timeout, poll).Should(Succeed())

	// c joins: the drains name it. No instance acknowledges yet.
	reg.Set(ns, members(membership.StateReady, three...))
	var toC []string
	for _, name := range names {
		if expected(t, three, ns, name) != expected(t, two, ns, name) {
			toC = append(toC, name)
		}
	}
	g.Expect(toC).NotTo(BeEmpty())
	g.Eventually(func(g Gomega) {
		got := labelsOf(g, ns)
		for _, name := range toC {
			g.Expect(got[name]).To(HaveKeyWithValue(v1alpha1.DrainLabel(ns), "c"), name)
		}
	}, timeout, poll).Should(Succeed())

	// The sharder is away while the acknowledgements land and c dies, so
	// that it cannot withdraw the drains first.
	stop()
	for _, name := range toC {
		cm := &metav1.PartialObjectMetadata{}
		cm.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("ConfigMap"))
		g.Expect(env().Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, cm)).To(Succeed())
		g.Expect(drain.Acknowledge(ctx, env().Client, cm, ns)).To(Succeed())
		g.Expect(cm.Labels).To(HaveKeyWithValue(v1alpha1.ShardLabel(ns), "c"), name)
	}
	reg.Set(ns, append(members(membership.StateReady, two...), members(membership.StateDead, "c")...))
	startSharder(t, reg, assign.Options{})
	g.Eventually(func(g Gomega) {
		got := labelsOf(g, ns)
		for _, name := range names {
			g.Expect(got[name]).To(HaveKeyWithValue(v1alpha1.ShardLabel(ns), expected(t, two, ns, name)), name)
			g.Expect(got[name]).NotTo(HaveKey(v1alpha1.DrainLabel(ns)), name)
		}
	}, timeout, poll).Should(Succeed())
}

func TestUnacknowledgedDrainIsForcedAfterTimeout(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	const drainTimeout = 30 * time.Second
	reg := leasecontroller.NewRegistry()
	reg.Set(ns, members(membership.StateReady, "a"))
	newRing(t, ns, func(s *v1alpha1.ControllerRingSpec) { s.DrainTimeout = &metav1.Duration{Duration: drainTimeout} })
	names := createConfigMaps(t, ns, "cm", 20)
	// The sharder's clock stands still until the test moves it, so the drain
	// can only time out when the test says so.
	clk := clocktesting.NewFakeClock(time.Now())
	startSharder(t, reg, assign.Options{Clock: clk})
	g.Eventually(func(g Gomega) {
		for _, l := range labelsOf(g, ns) {
			g.Expect(l).To(HaveKeyWithValue(v1alpha1.ShardLabel(ns), "a"))
		}
	}, timeout, poll).Should(Succeed())

	reg.Set(ns, members(membership.StateReady, "a", "b"))
	after := []string{"a", "b"}
	var toB []string
	for _, name := range names {
		if expected(t, after, ns, name) == "b" {
			toB = append(toB, name)
		}
	}
	g.Expect(toB).NotTo(BeEmpty())
	onAWithDrain := func(g Gomega) {
		got := labelsOf(g, ns)
		for _, name := range toB {
			g.Expect(got[name]).To(HaveKeyWithValue(v1alpha1.ShardLabel(ns), "a"))
			g.Expect(got[name]).To(HaveKey(v1alpha1.DrainLabel(ns)))
		}
	}
	g.Eventually(onAWithDrain, timeout, poll).Should(Succeed())
	// The drains' timeouts start when the sharder records them, just after
	// its writes: wait for that before moving the clock.
	g.Eventually(func() float64 { return testutil.ToFloat64(metrics.DrainsTotal.WithLabelValues(ns)) }, timeout, poll).
		Should(BeEquivalentTo(len(toB)))
	clk.Step(drainTimeout - time.Second)
	g.Consistently(onAWithDrain, time.Second, poll).Should(Succeed(), "forced before the drain timed out")

	// The drain times out: the objects are released from a (no shard label,
	// the drain label stays) so that a drops them and cancels its
	// reconciles, and stay with nobody for the grace.
	clk.Step(time.Second)
	released := func(g Gomega) {
		got := labelsOf(g, ns)
		for _, name := range toB {
			g.Expect(got[name]).NotTo(HaveKey(v1alpha1.ShardLabel(ns)), name)
			g.Expect(got[name]).To(HaveKey(v1alpha1.DrainLabel(ns)), name)
		}
	}
	g.Eventually(released, timeout, poll).Should(Succeed())
	clk.Step(assign.ForceGrace - time.Millisecond)
	g.Consistently(released, time.Second, poll).Should(Succeed(), "assigned before the grace ended")

	clk.Step(time.Millisecond)
	g.Eventually(func(g Gomega) {
		// Time goes on: a write that failed on a loaded API server is
		// retried after a backoff on the sharder's clock.
		clk.Step(10 * time.Millisecond)
		got := labelsOf(g, ns)
		for _, name := range toB {
			g.Expect(got[name]).To(HaveKeyWithValue(v1alpha1.ShardLabel(ns), "b"))
			g.Expect(got[name]).NotTo(HaveKey(v1alpha1.DrainLabel(ns)))
		}
	}, timeout, poll).Should(Succeed())
}

func TestDeadInstanceObjectsMoveAtOnce(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	reg := leasecontroller.NewRegistry()
	reg.Set(ns, members(membership.StateReady, "a", "b", "c"))
	newRing(t, ns, nil) // drainTimeout 1h: a drain would never finish in this test
	names := createConfigMaps(t, ns, "cm", 60)
	startSharder(t, reg, assign.Options{})
	all := []string{"a", "b", "c"}
	g.Eventually(assigned(ns, names, placed(t, ns, all...)), timeout, poll).Should(Succeed())

	h := watchHistory(t, configMaps, ns, ns)
	reg.Set(ns, append(members(membership.StateReady, "a", "b"), members(membership.StateDead, "c")...))
	g.Eventually(assigned(ns, names, placed(t, ns, "a", "b")), 5*time.Second, poll).Should(Succeed())
	for _, name := range names {
		g.Expect(h.drained(name)).To(BeFalse(), "%s was drained; objects of a dead instance move at once", name)
	}
	g.Eventually(func(g Gomega) {
		r := getRing(g, ns)
		g.Expect(r.Status.Instances).To(BeEquivalentTo(3))
		g.Expect(r.Status.AvailableInstances).To(BeEquivalentTo(2))
		for _, m := range r.Status.Members {
			if m.Name == "c" {
				g.Expect(m.State).To(Equal("dead"))
				g.Expect(m.Objects).To(BeZero())
			}
		}
	}, timeout, poll).Should(Succeed())
}

func TestNamespaceSelector(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	other := env().Namespace(t)
	ctx := context.Background()
	reg := leasecontroller.NewRegistry()
	reg.Set(ns, members(membership.StateReady, "a"))
	newRing(t, ns, func(s *v1alpha1.ControllerRingSpec) {
		s.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"sharded-by": ns}}
	})
	g.Expect(labelNamespace(ctx, ns, ns)).To(Succeed())
	startSharder(t, reg, assign.Options{})
	in := createConfigMaps(t, ns, "in", 5)
	out := createConfigMaps(t, other, "out", 5)

	g.Eventually(assigned(ns, in, on("a")), timeout, poll).Should(Succeed())
	g.Consistently(func(g Gomega) {
		for _, l := range labelsOf(g, other) {
			g.Expect(l).NotTo(HaveKey(v1alpha1.ShardLabel(ns)))
		}
	}, time.Second, 100*time.Millisecond).Should(Succeed())

	// Selecting the other namespace later assigns its objects.
	g.Expect(labelNamespace(ctx, other, ns)).To(Succeed())
	g.Eventually(func(g Gomega) {
		got := labelsOf(g, other)
		for _, name := range out {
			g.Expect(got[name]).To(HaveKeyWithValue(v1alpha1.ShardLabel(ns), "a"))
		}
	}, timeout, poll).Should(Succeed())
}

func labelNamespace(ctx context.Context, name, value string) error {
	nsObj := &corev1.Namespace{}
	if err := env().Client.Get(ctx, client.ObjectKey{Name: name}, nsObj); err != nil {
		return err
	}
	patch := client.MergeFrom(nsObj.DeepCopy())
	if nsObj.Labels == nil {
		nsObj.Labels = map[string]string{}
	}
	nsObj.Labels["sharded-by"] = value
	return env().Client.Patch(ctx, nsObj, patch)
}

func TestUnknownResourceIsReportedAndOthersKeepWorking(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	reg := leasecontroller.NewRegistry()
	reg.Set(ns, members(membership.StateReady, "a"))
	newRing(t, ns, func(s *v1alpha1.ControllerRingSpec) {
		s.Resources = append(s.Resources, v1alpha1.RingResource{Group: "example.com", Resource: "widgets"})
	})
	startSharder(t, reg, assign.Options{})
	names := createConfigMaps(t, ns, "cm", 5)

	g.Eventually(func(g Gomega) {
		r := getRing(g, ns)
		cond := meta.FindStatusCondition(r.Status.Conditions, v1alpha1.ConditionReady)
		g.Expect(cond).NotTo(BeNil())
		g.Expect(cond.Status).To(Equal(metav1.ConditionFalse))
		g.Expect(cond.Reason).To(Equal(v1alpha1.ReasonResourceNotServed))
		g.Expect(cond.Message).To(ContainSubstring("widgets.example.com"))
	}, timeout, poll).Should(Succeed())
	g.Eventually(assigned(ns, names, on("a")), timeout, poll).Should(Succeed())
}

func TestRestartDoesNotMoveOrRewrite(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	reg := leasecontroller.NewRegistry()
	reg.Set(ns, members(membership.StateReady, "a", "b"))
	newRing(t, ns, nil)
	names := createConfigMaps(t, ns, "cm", 30)

	stop := startSharder(t, reg, assign.Options{})
	g.Eventually(func(g Gomega) {
		got := labelsOf(g, ns)
		for _, name := range names {
			g.Expect(got[name]).To(HaveKey(v1alpha1.ShardLabel(ns)))
		}
	}, timeout, poll).Should(Succeed())
	stop()

	before := resourceVersions(g, ns)
	reg2 := leasecontroller.NewRegistry()
	reg2.Set(ns, members(membership.StateReady, "a", "b"))
	startSharder(t, reg2, assign.Options{})
	// A new object assigned proves the new sharder synced and worked.
	fresh := createConfigMaps(t, ns, "fresh", 1)[0]
	g.Eventually(func(g Gomega) {
		g.Expect(labelsOf(g, ns)[fresh]).To(HaveKey(v1alpha1.ShardLabel(ns)))
	}, timeout, poll).Should(Succeed())
	g.Consistently(func(g Gomega) {
		now := resourceVersions(g, ns)
		for name, rv := range before {
			g.Expect(now).To(HaveKeyWithValue(name, rv), "a restarted sharder rewrote %s", name)
		}
	}, time.Second, 200*time.Millisecond).Should(Succeed())
}

func resourceVersions(g Gomega, ns string) map[string]string {
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("ConfigMapList"))
	g.Expect(env().Client.List(context.Background(), list, client.InNamespace(ns))).To(Succeed())
	out := map[string]string{}
	for _, o := range list.Items {
		out[o.Name] = o.ResourceVersion
	}
	return out
}
