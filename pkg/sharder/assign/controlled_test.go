package assign_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/drain"
	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/sharder/assign"
	"github.com/sharder-dev/sharder/pkg/sharder/leasecontroller"
)

var (
	secrets         = schema.GroupVersionResource{Version: "v1", Resource: "secrets"}
	serviceAccounts = schema.GroupVersionResource{Version: "v1", Resource: "serviceaccounts"}
)

// TestControlledObjectsFollowTheirOwner: ConfigMaps are main objects,
// Secrets controlled by them and ServiceAccounts controlled by those Secrets
// (two levels). Children created after their owner get its instance; when
// the owner moves, its children are relabelled first.
func TestControlledObjectsFollowTheirOwner(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := env().Namespace(t)
	reg := leasecontroller.NewRegistry()
	reg.Set(ns, members(membership.StateReady, "a", "b", "c"))
	newRing(t, ns, func(s *v1alpha1.ControllerRingSpec) {
		s.Resources[0].ControlledResources = []metav1.GroupResource{{Resource: "secrets"}, {Resource: "serviceaccounts"}}
	})
	owners := createConfigMaps(t, ns, "owner", 12)
	startSharder(t, reg, assign.Options{})
	all := []string{"a", "b", "c"}
	g.Eventually(assigned(ns, owners, placed(t, ns, all...)), timeout, poll).Should(Succeed())

	// Children and grandchildren created after their owner was assigned.
	for _, owner := range owners {
		cm := &corev1.ConfigMap{}
		g.Expect(env().Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: owner}, cm)).To(Succeed())
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: owner + "-secret", OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "v1", Kind: "ConfigMap", Name: cm.Name, UID: cm.UID, Controller: ptr.To(true),
		}}}}
		g.Expect(env().Client.Create(ctx, sec)).To(Succeed())
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: owner + "-sa", OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "v1", Kind: "Secret", Name: sec.Name, UID: sec.UID, Controller: ptr.To(true),
		}}}}
		g.Expect(env().Client.Create(ctx, sa)).To(Succeed())
	}
	// Controlled resources without a controller in the ring stay unassigned.
	orphan := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "orphan"}}
	g.Expect(env().Client.Create(ctx, orphan)).To(Succeed())

	shardOf := func(g Gomega, obj client.Object) string {
		g.Expect(env().Client.Get(ctx, client.ObjectKeyFromObject(obj), obj)).To(Succeed())
		return obj.GetLabels()[v1alpha1.ShardLabel(ns)]
	}
	g.Eventually(func(g Gomega) {
		for _, owner := range owners {
			want := expected(t, all, ns, owner)
			g.Expect(shardOf(g, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: owner + "-secret"}})).To(Equal(want), owner)
			g.Expect(shardOf(g, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: owner + "-sa"}})).To(Equal(want), owner)
		}
	}, timeout, poll).Should(Succeed())
	g.Expect(shardOf(g, orphan)).To(BeEmpty())

	// The instance of the first owner dies (so that some owner moves,
	// whatever the namespace's name hashes to): its owners move with their
	// children, children first.
	victim := expected(t, all, ns, owners[0])
	left := slices.DeleteFunc(slices.Clone(all), func(id string) bool { return id == victim })
	cmHistory := watchHistory(t, configMaps, ns, ns)
	secHistory := watchHistory(t, secrets, ns, ns)
	saHistory := watchHistory(t, serviceAccounts, ns, ns)
	reg.Set(ns, append(members(membership.StateReady, left...), members(membership.StateDead, victim)...))
	var moved []string
	for _, owner := range owners {
		if expected(t, all, ns, owner) == victim {
			moved = append(moved, owner)
		}
	}
	g.Eventually(func(g Gomega) {
		for _, owner := range owners {
			want := expected(t, left, ns, owner)
			g.Expect(shardOf(g, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: owner}})).To(Equal(want), owner)
			g.Expect(shardOf(g, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: owner + "-secret"}})).To(Equal(want), owner)
			g.Expect(shardOf(g, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: owner + "-sa"}})).To(Equal(want), owner)
		}
	}, timeout, poll).Should(Succeed())

	relabelled := func(h *history, name, to string) int64 {
		for _, e := range h.of(name) {
			if e.shard == to {
				return e.resourceVersion
			}
		}
		return 0
	}
	for _, owner := range moved {
		to := expected(t, left, ns, owner)
		ownerRV := relabelled(cmHistory, owner, to)
		secRV := relabelled(secHistory, owner+"-secret", to)
		saRV := relabelled(saHistory, owner+"-sa", to)
		g.Expect(ownerRV).NotTo(BeZero())
		g.Expect(secRV).To(And(BeNumerically(">", 0), BeNumerically("<", ownerRV)), fmt.Sprintf("%s: Secret relabelled after its owner", owner))
		g.Expect(saRV).To(And(BeNumerically(">", 0), BeNumerically("<", ownerRV)), fmt.Sprintf("%s: ServiceAccount relabelled after its owner", owner))
	}
}

// TestOwnerWithControlledObjectsIsDrainedWithoutTarget: the drain of an
// owner with controlled objects names no target, so that its instance's
// acknowledgement removes both labels and the sharder moves the children
// before the owner, as on every move.
func TestOwnerWithControlledObjectsIsDrainedWithoutTarget(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := env().Namespace(t)
	reg := leasecontroller.NewRegistry()
	reg.Set(ns, members(membership.StateReady, "a", "b"))
	newRing(t, ns, func(s *v1alpha1.ControllerRingSpec) {
		s.Resources[0].ControlledResources = []metav1.GroupResource{{Resource: "secrets"}}
	})
	owners := createConfigMaps(t, ns, "owner", 30)
	for _, owner := range owners {
		cm := &corev1.ConfigMap{}
		g.Expect(env().Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: owner}, cm)).To(Succeed())
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: owner + "-secret", OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "v1", Kind: "ConfigMap", Name: cm.Name, UID: cm.UID, Controller: ptr.To(true),
		}}}}
		g.Expect(env().Client.Create(ctx, sec)).To(Succeed())
	}
	startSharder(t, reg, assign.Options{})
	two, three := []string{"a", "b"}, []string{"a", "b", "c"}
	g.Eventually(func(g Gomega) {
		for _, owner := range owners {
			sec := &corev1.Secret{}
			g.Expect(env().Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: owner + "-secret"}, sec)).To(Succeed())
			g.Expect(sec.Labels).To(HaveKeyWithValue(v1alpha1.ShardLabel(ns), expected(t, two, ns, owner)), owner)
		}
	}, timeout, poll).Should(Succeed())
	g.Eventually(assigned(ns, owners, placed(t, ns, two...)), timeout, poll).Should(Succeed())

	cmHistory := watchHistory(t, configMaps, ns, ns)
	secHistory := watchHistory(t, secrets, ns, ns)
	acknowledger(t, ns, ns, func(string) bool { return true })
	reg.Set(ns, members(membership.StateReady, three...))
	g.Eventually(assigned(ns, owners, placed(t, ns, three...)), timeout, poll).Should(Succeed())

	moved := 0
	for _, owner := range owners {
		from, to := expected(t, two, ns, owner), expected(t, three, ns, owner)
		if from == to {
			continue
		}
		moved++
		want := []string{from + "/-", from + "/" + drain.NoTarget, "/-", to + "/-"}
		g.Eventually(func() []string { return cmHistory.states(owner) }, timeout, poll).Should(Equal(want), owner)
		var ownerRV, secRV int64
		for _, e := range cmHistory.of(owner) {
			if e.shard == to {
				ownerRV = e.resourceVersion
			}
		}
		g.Eventually(func() int64 {
			for _, e := range secHistory.of(owner + "-secret") {
				if e.shard == to {
					secRV = e.resourceVersion
				}
			}
			return secRV
		}, timeout, poll).ShouldNot(BeZero(), owner)
		g.Expect(secRV).To(BeNumerically("<", ownerRV), "%s: Secret relabelled after its owner", owner)
	}
	g.Expect(moved).To(BeNumerically(">", 0))
}

// TestNamespacedChildrenOfClusterScopedOwner: the main resource is
// cluster-scoped (PriorityClasses) and controls namespaced ConfigMaps.
// The children take their owner's instance, and move with it.
func TestNamespacedChildrenOfClusterScopedOwner(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := env().Namespace(t)
	reg := leasecontroller.NewRegistry()
	reg.Set(ns, members(membership.StateReady, "a", "b", "c"))
	newRing(t, ns, func(s *v1alpha1.ControllerRingSpec) {
		s.Resources = []v1alpha1.RingResource{{
			Group: "scheduling.k8s.io", Resource: "priorityclasses",
			ControlledResources: []metav1.GroupResource{{Resource: "configmaps"}},
		}}
	})
	var owners []string
	for i := range 12 {
		pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", ns, i)}, Value: int32(i)}
		g.Expect(env().Client.Create(ctx, pc)).To(Succeed())
		t.Cleanup(func() { _ = env().Client.Delete(context.Background(), pc) })
		owners = append(owners, pc.Name)
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: pc.Name + "-child", OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "scheduling.k8s.io/v1", Kind: "PriorityClass", Name: pc.Name, UID: pc.UID, Controller: ptr.To(true),
		}}}}
		g.Expect(env().Client.Create(ctx, cm)).To(Succeed())
	}
	startSharder(t, reg, assign.Options{})

	shardOf := func(g Gomega, obj client.Object) string {
		g.Expect(env().Client.Get(ctx, client.ObjectKeyFromObject(obj), obj)).To(Succeed())
		return obj.GetLabels()[v1alpha1.ShardLabel(ns)]
	}
	sameInstance := func(g Gomega, allowed ...string) map[string]string {
		placed := map[string]string{}
		for _, name := range owners {
			owner := shardOf(g, &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: name}})
			g.Expect(owner).To(BeElementOf(allowed), name)
			g.Expect(shardOf(g, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-child"}})).
				To(Equal(owner), "the child of %s", name)
			placed[name] = owner
		}
		return placed
	}
	all := []string{"a", "b", "c"}
	var before map[string]string
	g.Eventually(func(g Gomega) { before = sameInstance(g, all...) }, timeout, poll).Should(Succeed())

	// The instance of the first owner dies (so that some owner moves,
	// whatever the names hash to): its owners move, and their children with
	// them.
	victim := before[owners[0]]
	left := slices.DeleteFunc(slices.Clone(all), func(id string) bool { return id == victim })
	reg.Set(ns, append(members(membership.StateReady, left...), members(membership.StateDead, victim)...))
	g.Eventually(func(g Gomega) { sameInstance(g, left...) }, timeout, poll).Should(Succeed())
}

// TestControlledObjectsAreLabelledConcurrently: the controlled objects of
// one main object are written at the same time, not one after another (a
// main object with many children would otherwise move at the speed of one
// round trip per child). One worker, so only one main object is in hand.
func TestControlledObjectsAreLabelledConcurrently(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := env().Namespace(t)
	reg := leasecontroller.NewRegistry()
	reg.Set(ns, members(membership.StateReady, "a"))
	newRing(t, ns, func(s *v1alpha1.ControllerRingSpec) {
		s.Resources[0].ControlledResources = []metav1.GroupResource{{Resource: "secrets"}}
	})
	owner := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "owner"}}
	g.Expect(env().Client.Create(ctx, owner)).To(Succeed())
	for i := range 8 {
		g.Expect(env().Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: fmt.Sprintf("child-%d", i),
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID, Controller: ptr.To(true)}},
		}})).To(Succeed())
	}

	// Each write of a Secret takes 100 ms; record how many overlap.
	var inFlight, most atomic.Int32
	cfg := rest.CopyConfig(env().Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
			if req.Method == http.MethodPatch && strings.Contains(req.URL.Path, "/secrets/") {
				n := inFlight.Add(1)
				defer inFlight.Add(-1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				time.Sleep(100 * time.Millisecond)
			}
			return rt.RoundTrip(req)
		})
	})
	startSharderWith(t, cfg, reg, assign.Options{Workers: 1}, nil)
	g.Eventually(func(g Gomega) {
		list := &corev1.SecretList{}
		g.Expect(env().Client.List(ctx, list, client.InNamespace(ns))).To(Succeed())
		g.Expect(list.Items).To(HaveLen(8))
		for _, s := range list.Items {
			g.Expect(s.Labels).To(HaveKeyWithValue(v1alpha1.ShardLabel(ns), "a"), s.Name)
		}
	}, timeout, poll).Should(Succeed())
	g.Expect(most.Load()).To(BeNumerically(">", 1), "the children were written one after another")
}
