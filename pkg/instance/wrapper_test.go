package instance_test

// Tests of the reconciler wrapper and the Lease integration against a real
// API server. The test plays the sharder: it labels objects and sets drain
// labels itself.

import (
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/instance"
)

// gate blocks reconciles of chosen objects in controller "a" until released.
type gate struct {
	mu       sync.Mutex
	entered  map[string]chan struct{}
	released map[string]chan struct{}
}

func newGate(names ...string) *gate {
	g := &gate{entered: map[string]chan struct{}{}, released: map[string]chan struct{}{}}
	for _, n := range names {
		g.entered[n] = make(chan struct{})
		g.released[n] = make(chan struct{})
	}
	return g
}

func (g *gate) hook(ctx context.Context, controller string, req reconcile.Request) {
	if controller != "a" {
		return
	}
	g.mu.Lock()
	entered, ok := g.entered[req.Name]
	released := g.released[req.Name]
	if ok {
		delete(g.entered, req.Name) // block only the first reconcile
	}
	g.mu.Unlock()
	if !ok {
		return
	}
	close(entered)
	select {
	case <-released:
	case <-ctx.Done():
	}
}

func createConfigMap(t *testing.T, ns, name string, labels map[string]string) *corev1.ConfigMap {
	t.Helper()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels}}
	if err := env().Client.Create(context.Background(), cm); err != nil {
		t.Fatal(err)
	}
	return cm
}

func patchLabels(g Gomega, cm *corev1.ConfigMap, set map[string]*string) {
	labels := map[string]any{}
	for k, v := range set {
		if v == nil {
			labels[k] = nil
		} else {
			labels[k] = *v
		}
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(env().Client.Patch(context.Background(), cm.DeepCopy(), client.RawPatch(types.MergePatchType, patch))).To(Succeed())
}

func labelsOf(g Gomega, cm *corev1.ConfigMap) map[string]string {
	got := &corev1.ConfigMap{}
	g.Expect(env().Client.Get(context.Background(), client.ObjectKeyFromObject(cm), got)).To(Succeed())
	return got.Labels
}

func TestDrainWaitsForReconcileInFlight(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	const ring, id = "drain-wait", "i1"
	rec := newRecorder()
	gt := newGate("busy")
	startInstance(t, instanceConfig{ring: ring, namespace: ns, id: id, rec: rec, hook: gt.hook, work: 5 * time.Millisecond})

	cm := createConfigMap(t, ns, "busy", map[string]string{v1alpha1.ShardLabel(ring): id})
	g.Eventually(gt.entered["busy"], 20*time.Second).Should(BeClosed(), "controller a reconciles the object")
	// Controller b has reconciled it too: no request of its own from before
	// the drain is left (requests that arrived before the instance held its
	// Lease are retried later), so every run after the drain request would
	// be one the wrapper should not have let through.
	g.Eventually(func() bool {
		return slices.ContainsFunc(rec.runsOf("busy", id), func(iv interval) bool { return iv.controller == "b" })
	}, 10*time.Second).Should(BeTrue(), "controller b reconciles the object")

	// The sharder asks for the object back while controller a still works on
	// it; controller b sees the drain label first.
	drainAt := time.Now()
	patchLabels(g, cm, map[string]*string{v1alpha1.DrainLabel(ring): ptr.To("true")})
	g.Consistently(func(g Gomega) map[string]string { return labelsOf(g, cm) }, 500*time.Millisecond).
		Should(HaveKeyWithValue(v1alpha1.ShardLabel(ring), id), "no acknowledgement while a reconcile is in flight")

	close(gt.released["busy"])
	g.Eventually(func(g Gomega) map[string]string { return labelsOf(g, cm) }, 10*time.Second).
		ShouldNot(Or(HaveKey(v1alpha1.ShardLabel(ring)), HaveKey(v1alpha1.DrainLabel(ring))))
	g.Eventually(func() int { return rec.drainedOf(id, "busy") }, 10*time.Second).Should(Equal(1))
	g.Expect(rec.lostOf(id, "busy")).To(BeZero())

	// Requests queued meanwhile (controller a saw the drain update while it
	// was blocked) are handled without reconciling the drained object.
	g.Eventually(func() int { return rec.requestsOf(id, "a", "busy") }, 10*time.Second).Should(BeNumerically(">=", 2))
	for _, run := range rec.runsOf("busy", id) {
		g.Expect(run.start.Before(drainAt)).To(BeTrue(), "no reconcile starts after the drain was requested: %+v", run)
	}
}

// TestDrainHandsTheObjectOver: a drain naming the next instance is
// acknowledged, once no reconcile is in flight, by one patch that sets the
// shard label to that instance and removes the drain label.
func TestDrainHandsTheObjectOver(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	const ring, id = "hand-over", "i1"
	rec := newRecorder()
	gt := newGate("handed")
	startInstance(t, instanceConfig{ring: ring, namespace: ns, id: id, rec: rec, hook: gt.hook})

	cm := createConfigMap(t, ns, "handed", map[string]string{v1alpha1.ShardLabel(ring): id})
	g.Eventually(gt.entered["handed"], 20*time.Second).Should(BeClosed())
	patchLabels(g, cm, map[string]*string{v1alpha1.DrainLabel(ring): ptr.To("i2")})
	g.Consistently(func(g Gomega) map[string]string { return labelsOf(g, cm) }, 500*time.Millisecond).
		Should(HaveKeyWithValue(v1alpha1.DrainLabel(ring), "i2"), "no acknowledgement while a reconcile is in flight")

	close(gt.released["handed"])
	g.Eventually(func(g Gomega) map[string]string { return labelsOf(g, cm) }, 10*time.Second).
		Should(And(HaveKeyWithValue(v1alpha1.ShardLabel(ring), "i2"), Not(HaveKey(v1alpha1.DrainLabel(ring)))))
	g.Eventually(func() int { return rec.drainedOf(id, "handed") }, 10*time.Second).Should(Equal(1))
	g.Expect(rec.lostOf(id, "handed")).To(BeZero())
}

// TestHandedOverObjectIsNotReadBack: when an object this instance handed
// over leaves its cache, each controller's request for it is dropped
// without reading it from the API server (the instance knows it moved).
func TestHandedOverObjectIsNotReadBack(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	const ring, id, name = "hand-over-no-read", "i1", "handed"
	var reads atomic.Int32
	cfg := rest.CopyConfig(env().Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripper(func(req *http.Request) (*http.Response, error) {
			if req.Method == http.MethodGet && strings.HasSuffix(req.URL.Path, "/namespaces/"+ns+"/configmaps/"+name) {
				reads.Add(1)
			}
			return rt.RoundTrip(req)
		})
	})
	var mu sync.Mutex
	absent := map[string]int{}
	rec := newRecorder()
	startInstance(t, instanceConfig{ring: ring, namespace: ns, id: id, rec: rec, restConfig: cfg,
		absentHandled: func(controller string, req reconcile.Request) {
			if req.Name == name {
				mu.Lock()
				absent[controller]++
				mu.Unlock()
			}
		}})

	cm := createConfigMap(t, ns, name, map[string]string{v1alpha1.ShardLabel(ring): id})
	for _, c := range []string{"a", "b"} {
		g.Eventually(func() bool {
			return slices.ContainsFunc(rec.runsOf(name, id), func(iv interval) bool { return iv.controller == c })
		}, 20*time.Second).Should(BeTrue(), "controller %s reconciles the object", c)
	}
	patchLabels(g, cm, map[string]*string{v1alpha1.DrainLabel(ring): ptr.To("i2")})
	g.Eventually(func(g Gomega) map[string]string { return labelsOf(g, cm) }, 10*time.Second).
		Should(And(HaveKeyWithValue(v1alpha1.ShardLabel(ring), "i2"), Not(HaveKey(v1alpha1.DrainLabel(ring)))))
	g.Eventually(func() int { return rec.drainedOf(id, name) }, 10*time.Second).Should(Equal(1))

	g.Eventually(func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(absent)
	}, 10*time.Second).Should(And(HaveKeyWithValue("a", BeNumerically(">=", 1)), HaveKeyWithValue("b", BeNumerically(">=", 1))),
		"each controller handled a request for the object after it left the cache")
	g.Expect(reads.Load()).To(BeZero(), "no read of the handed-over object from the API server")
	for _, run := range rec.runsOf(name, id) {
		g.Expect(run.notFound).To(BeFalse(), "a handed-over object is not reported as deleted")
	}
}

// roundTripper is an http.RoundTripper made of a function.
type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

func TestStaleRequestForMovedObjectIsDropped(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	const ring, id = "stale", "i1"
	rec := newRecorder()
	gt := newGate("moved")
	startInstance(t, instanceConfig{ring: ring, namespace: ns, id: id, rec: rec, hook: gt.hook})

	cm := createConfigMap(t, ns, "moved", map[string]string{v1alpha1.ShardLabel(ring): id})
	g.Eventually(gt.entered["moved"], 20*time.Second).Should(BeClosed())
	runsOfB := func() int {
		n := 0
		for _, run := range rec.runsOf("moved", id) {
			if run.controller == "b" {
				n++
			}
		}
		return n
	}
	// Controller b's run of the creation ended, so the change below is a
	// request of its own there, not folded into a queued one.
	g.Eventually(runsOfB, 10*time.Second).Should(Equal(1))

	// A change queues another request in controller a, then the sharder moves
	// the object away at once (as from a dead instance).
	patchLabels(g, cm, map[string]*string{"touched": ptr.To("yes")})
	// Wait for controller b's run of that change to end: a run under way when
	// the object leaves the cache can read it as absent before the instance
	// cancels the run, which is the cancellation's promise, not this test's.
	g.Eventually(runsOfB, 10*time.Second).Should(Equal(2))
	patchLabels(g, cm, map[string]*string{v1alpha1.ShardLabel(ring): ptr.To("i2")})
	g.Eventually(func() int { return rec.lostOf(id, "moved") }, 10*time.Second).Should(Equal(1))
	movedAt := time.Now()

	close(gt.released["moved"])
	g.Eventually(func() int { return rec.requestsOf(id, "a", "moved") }, 10*time.Second).Should(BeNumerically(">=", 2),
		"the queued request reached the wrapper")
	// Runs are recorded when they end: the blocked one shows up now.
	g.Eventually(func() bool {
		return slices.ContainsFunc(rec.runsOf("moved", id), func(iv interval) bool { return iv.controller == "a" })
	}, 10*time.Second).Should(BeTrue())
	g.Consistently(func(g Gomega) {
		for _, run := range rec.runsOf("moved", id) {
			g.Expect(run.start.Before(movedAt)).To(BeTrue(), "the user reconciler never sees the moved object again: %+v", run)
			g.Expect(run.notFound).To(BeFalse(), "a moved object is not reported as deleted")
		}
	}, 300*time.Millisecond).Should(Succeed())
	g.Expect(rec.drainedOf(id, "moved")).To(BeZero())
}

func TestDeletionReachesReconciler(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	const ring, id = "deletion", "i1"
	rec := newRecorder()
	startInstance(t, instanceConfig{ring: ring, namespace: ns, id: id, rec: rec})

	cm := createConfigMap(t, ns, "doomed", map[string]string{v1alpha1.ShardLabel(ring): id})
	createConfigMap(t, ns, "elsewhere", map[string]string{v1alpha1.ShardLabel(ring): "i2"})
	g.Eventually(func() []interval { return rec.runsOf("doomed", id) }, 20*time.Second).ShouldNot(BeEmpty())
	g.Eventually(func() bool { _, ok := rec.gainedAt(id, "doomed"); return ok }, 10*time.Second).Should(BeTrue())

	g.Expect(env().Client.Delete(context.Background(), cm)).To(Succeed())
	g.Eventually(func() bool {
		runs := rec.runsOf("doomed", id)
		return len(runs) > 0 && runs[len(runs)-1].notFound
	}, 10*time.Second).Should(BeTrue(), "the reconciler handles the deletion")
	g.Eventually(func() int { return rec.lostOf(id, "doomed") }, 10*time.Second).Should(Equal(1))

	g.Expect(rec.runsOf("elsewhere", "")).To(BeEmpty(), "another instance's object is never reconciled")
	_, gained := rec.gainedAt(id, "elsewhere")
	g.Expect(gained).To(BeFalse())
}

func TestNoReconcileBeforeLeaseIsHeld(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	const ring, id = "gated", "i1"
	ctx := context.Background()

	// Someone else holds the instance's Lease, freshly renewed.
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: id, Labels: map[string]string{v1alpha1.LabelRing: ring}},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       ptr.To("someone-else"),
			LeaseDurationSeconds: ptr.To[int32](60),
			RenewTime:            ptr.To(metav1.NewMicroTime(time.Now())),
		},
	}
	g.Expect(env().Client.Create(ctx, lease)).To(Succeed())

	rec := newRecorder()
	startInstance(t, instanceConfig{ring: ring, namespace: ns, id: id, rec: rec})
	createConfigMap(t, ns, "waiting", map[string]string{v1alpha1.ShardLabel(ring): id})
	g.Eventually(func() int { return rec.requestsOf(id, "a", "waiting") }, 20*time.Second).Should(BeNumerically(">=", 1))
	g.Consistently(func() []interval { return rec.runsOf("waiting", id) }, time.Second).Should(BeEmpty(),
		"nothing is reconciled while another party holds the Lease")

	// The other party releases the Lease: once a lease duration has passed
	// since (short here), the holder acquires it and the retried request
	// goes through.
	g.Expect(env().Client.Get(ctx, client.ObjectKeyFromObject(lease), lease)).To(Succeed())
	lease.Spec.HolderIdentity = ptr.To("")
	lease.Spec.LeaseDurationSeconds = ptr.To[int32](1)
	lease.Spec.RenewTime = ptr.To(metav1.NewMicroTime(time.Now()))
	g.Expect(env().Client.Update(ctx, lease)).To(Succeed())
	g.Eventually(func() []interval { return rec.runsOf("waiting", id) }, 10*time.Second).ShouldNot(BeEmpty())
}

func TestShutdownWaitsForReconcileBeforeRelease(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	const ring, id = "shutdown", "i1"
	rec := newRecorder()
	gt := newGate("slow")
	ti := startInstance(t, instanceConfig{ring: ring, namespace: ns, id: id, rec: rec, hook: gt.hook})
	createConfigMap(t, ns, "slow", map[string]string{v1alpha1.ShardLabel(ring): id})
	g.Eventually(gt.entered["slow"], 20*time.Second).Should(BeClosed())

	holder := func(g Gomega) string {
		lease := &coordinationv1.Lease{}
		g.Expect(env().Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: id}, lease)).To(Succeed())
		return ptr.Deref(lease.Spec.HolderIdentity, "")
	}
	g.Expect(holder(g)).To(Equal(id))

	ti.cancel()
	g.Consistently(holder, time.Second).Should(Equal(id), "the Lease is held while a reconcile runs")
	close(gt.released["slow"])
	g.Eventually(holder, 10*time.Second).Should(BeEmpty(), "released once the reconcile ended")
	g.Eventually(ti.done, 10*time.Second).Should(BeClosed())
	runs := rec.runsOf("slow", id)
	g.Expect(runs).NotTo(BeEmpty())
}

func TestClientGoInformerSeesOnlyItsObjects(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	const ring = "client-go"
	createConfigMap(t, ns, "mine", map[string]string{v1alpha1.ShardLabel(ring): "i1", "app": "x"})
	createConfigMap(t, ns, "mine-other-app", map[string]string{v1alpha1.ShardLabel(ring): "i1", "app": "y"})
	createConfigMap(t, ns, "theirs", map[string]string{v1alpha1.ShardLabel(ring): "i2", "app": "x"})
	createConfigMap(t, ns, "unassigned", map[string]string{"app": "x"})

	cs, err := kubernetes.NewForConfig(env().Config)
	g.Expect(err).NotTo(HaveOccurred())
	factory := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(ns),
		instance.WithTweakListOptions(ring, "i1"))
	lister := factory.Core().V1().ConfigMaps().Lister()
	ctx, cancel := context.WithCancel(context.Background())
	factory.Start(ctx.Done())
	defer func() {
		cancel()
		factory.Shutdown()
	}()
	for _, synced := range factory.WaitForCacheSync(ctx.Done()) {
		g.Expect(synced).To(BeTrue())
	}
	names := func(sel labels.Selector) []string {
		cms, err := lister.List(sel)
		g.Expect(err).NotTo(HaveOccurred())
		var out []string
		for _, cm := range cms {
			out = append(out, cm.Name)
		}
		return out
	}
	g.Expect(names(labels.Everything())).To(ConsistOf("mine", "mine-other-app"))

	// The tweak is ANDed with a selector of the informer's own.
	filtered := toolscache.NewFilteredListWatchFromClient(cs.CoreV1().RESTClient(), "configmaps", ns, func(opts *metav1.ListOptions) {
		opts.LabelSelector = "app=x"
		instance.TweakListOptions(ring, "i1")(opts)
	})
	list, err := filtered.ListWithContext(ctx, metav1.ListOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	items := list.(*corev1.ConfigMapList).Items
	g.Expect(items).To(HaveLen(1))
	g.Expect(items[0].Name).To(Equal("mine"))
}
