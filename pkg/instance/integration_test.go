package instance_test

// The whole protocol in one process: the sharder's lease controller and
// assignment engine, and three instances with managers, caches and Lease
// holders of their own, on a real API server.

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/internal/testenv"
	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/sharder/assign"
	"github.com/sharder-dev/sharder/pkg/sharder/leasecontroller"
)

// startSharder runs the lease controller and the assignment engine on a
// manager of their own until the test ends.
func startSharder(t *testing.T) {
	t.Helper()
	mgrOpts := env().ManagerOptions()
	mgrOpts.Cache = cache.Options{ByObject: leasecontroller.CacheByObject()}
	mgrOpts.Logger = ctrl.Log.WithName("sharder")
	mgr := env().NewManager(t, nil, mgrOpts)
	registry := leasecontroller.NewRegistry()
	lc, err := leasecontroller.New(leasecontroller.Options{Registry: registry, Identity: "sharder:test"})
	if err != nil {
		t.Fatal(err)
	}
	if err := lc.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	engine, err := assign.New(assign.Options{Registry: registry, EventRecorder: &record.FakeRecorder{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := engine.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	testenv.StartManager(t, mgr)
}

// createRing creates the ring named ns that shards the ConfigMaps of ns,
// with its instances' Leases in ns, until the test ends.
func createRing(t *testing.T, ns string, drainTimeout time.Duration) {
	t.Helper()
	ring := &v1alpha1.ControllerRing{
		ObjectMeta: metav1.ObjectMeta{Name: ns},
		Spec: v1alpha1.ControllerRingSpec{
			LeaseNamespace: ns,
			Resources:      []v1alpha1.RingResource{{Resource: "configmaps"}},
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{
				v1alpha1.LabelNamespaceName: ns,
			}},
			DrainTimeout: &metav1.Duration{Duration: drainTimeout},
		},
	}
	if err := env().Client.Create(context.Background(), ring); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env().Client.Delete(context.Background(), ring) })
}

// assignments returns each ConfigMap's shard and drain label.
func assignments(g Gomega, ns, ring string) (shard map[string]string, draining []string) {
	list := &corev1.ConfigMapList{}
	g.Expect(env().Client.List(context.Background(), list, client.InNamespace(ns))).To(Succeed())
	shard = map[string]string{}
	for _, cm := range list.Items {
		shard[cm.Name] = cm.Labels[v1alpha1.ShardLabel(ring)]
		if _, ok := cm.Labels[v1alpha1.DrainLabel(ring)]; ok {
			draining = append(draining, cm.Name)
		}
	}
	return shard, draining
}

// expectSettled waits until every ConfigMap is assigned to one of ids, none
// is draining, and every id holds some.
func expectSettled(g Gomega, ns, ring string, ids ...string) map[string]string {
	var shard map[string]string
	g.Eventually(func(g Gomega) {
		var draining []string
		shard, draining = assignments(g, ns, ring)
		g.Expect(draining).To(BeEmpty())
		perInstance := map[string]int{}
		for name, id := range shard {
			g.Expect(ids).To(ContainElement(id), "ConfigMap %s", name)
			perInstance[id]++
		}
		g.Expect(perInstance).To(HaveLen(len(ids)))
	}, 30*time.Second, 50*time.Millisecond).Should(Succeed())
	return shard
}

// touch changes a ConfigMap's data, so that its instance reconciles it.
func touch(ctx context.Context, ns, name, value string) error {
	patch, err := json.Marshal(map[string]any{"data": map[string]string{"touched": value}})
	if err != nil {
		return err
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	return env().Client.Patch(ctx, cm, client.RawPatch(types.MergePatchType, patch))
}

func TestScaleOutAndInWithoutConcurrentReconciles(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	ring := ns
	const objects = 40
	ctx := context.Background()

	startSharder(t)
	// Long enough that a forced move would mean a missing acknowledgement,
	// short enough to fail fast.
	createRing(t, ns, 15*time.Second)

	rec := newRecorder()
	start := func(id string) *testInstance {
		return startInstance(t, instanceConfig{ring: ring, namespace: ns, id: id, rec: rec, work: 300 * time.Millisecond})
	}
	instances := map[string]*testInstance{"i-0": start("i-0"), "i-1": start("i-1")}

	names := make([]string, objects)
	for n := range objects {
		names[n] = fmt.Sprintf("cm-%02d", n)
		createConfigMap(t, ns, names[n], nil)
	}
	before := expectSettled(g, ns, ring, "i-0", "i-1")
	t.Logf("two instances: %v", countPerInstance(before))

	// Keep the instances busy while objects move: every reconcile of a moving
	// object risks overlapping with its next instance's.
	churnCtx, stopChurn := context.WithCancel(ctx)
	var churn sync.WaitGroup
	churn.Go(func() {
		for i := 0; churnCtx.Err() == nil; i++ {
			_ = touch(churnCtx, ns, names[rand.IntN(objects)], fmt.Sprint(i))
			time.Sleep(5 * time.Millisecond)
		}
	})
	defer func() {
		stopChurn()
		churn.Wait()
	}()

	// Scale out: the new instance takes objects over, each drained by its
	// previous instance.
	instances["i-2"] = start("i-2")
	after := expectSettled(g, ns, ring, "i-0", "i-1", "i-2")
	t.Logf("three instances: %v", countPerInstance(after))
	g.Expect(rec.overlaps()).To(BeEmpty(), "no object is reconciled by two instances at the same time")
	moved := 0
	for name, id := range after {
		if id == before[name] {
			continue
		}
		moved++
		g.Expect(id).To(Equal("i-2"), "%s: adding an instance moves objects only to it", name)
		g.Eventually(func() int { return rec.drainedOf(before[name], name) }, 10*time.Second).Should(Equal(1),
			"%s was drained by %s", name, before[name])
		g.Expect(rec.lostOf(before[name], name)).To(BeZero(), "%s left %s without acknowledgement", name, before[name])
	}
	g.Expect(moved).To(BeNumerically(">", 0))

	// Scale in: a stopped instance releases its Lease and its objects move
	// at once to the others.
	instances["i-1"].stop(t)
	final := expectSettled(g, ns, ring, "i-0", "i-2")
	t.Logf("after scale-in: %v", countPerInstance(final))
	stopChurn()
	churn.Wait()

	// Every object ends on a ready instance and is reconciled there.
	g.Eventually(func(g Gomega) {
		for _, id := range []string{"i-0", "i-2"} {
			lease := &coordinationv1.Lease{}
			g.Expect(env().Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: id}, lease)).To(Succeed())
			state, _ := membership.StateOf(lease, time.Now())
			g.Expect(state).To(Equal(membership.StateReady), "instance %s", id)
		}
	}, 10*time.Second).Should(Succeed())
	touched := time.Now()
	for _, name := range names {
		g.Expect(touch(ctx, ns, name, "final")).To(Succeed())
	}
	for name, id := range final {
		g.Eventually(func() bool {
			for _, run := range rec.runsOf(name, id) {
				if !run.start.Before(touched) && !run.notFound {
					return true
				}
			}
			return false
		}, 10*time.Second).Should(BeTrue(), "%s is reconciled by its instance %s", name, id)
	}

	g.Expect(rec.overlaps()).To(BeEmpty(), "no object is reconciled by two instances at the same time")
	total := 0
	for _, name := range names {
		total += len(rec.runsOf(name, ""))
	}
	t.Logf("%d reconciles recorded, %d objects moved on scale-out, %d drains acknowledged by i-0, %d by i-1",
		total, moved, rec.drainedTotal("i-0"), rec.drainedTotal("i-1"))
}

// countPerInstance counts objects per instance.
func countPerInstance(shard map[string]string) map[string]int {
	out := map[string]int{}
	for _, id := range shard {
		out[id]++
	}
	return out
}
