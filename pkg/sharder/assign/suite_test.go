package assign_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/internal/testenv"
	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/drain"
	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/ring"
	"github.com/sharder-dev/sharder/pkg/sharder/assign"
	"github.com/sharder-dev/sharder/pkg/sharder/eventrecorder"
	"github.com/sharder-dev/sharder/pkg/sharder/leasecontroller"
)

var suite testenv.Suite // the control plane, started for the first test that calls env

func env() *testenv.Env { return suite.Env() }

func TestMain(m *testing.M) {
	s := testenv.DefaultScheme()
	if err := v1alpha1.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := apiextensionsv1.AddToScheme(s); err != nil {
		panic(err)
	}
	ctrl.SetLogger(testLogger())
	os.Exit(testenv.Run(m, &suite, testenv.Options{CRDDirectoryPaths: []string{"config/crd/bases"}, Scheme: s}))
}

var configMaps = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}

// startSharder runs a manager with the assignment controller on registry
// until the test ends or the returned function is called.
func startSharder(t testing.TB, registry *leasecontroller.Registry, opts assign.Options) (stop func()) {
	t.Helper()
	return startSharderWith(t, env().Config, registry, opts, nil)
}

// startSharderWith is startSharder; setup, when set, adds more parts to the
// manager (such as the lease controller).
func startSharderWith(t testing.TB, cfg *rest.Config, registry *leasecontroller.Registry, opts assign.Options, setup func(ctrl.Manager) error) (stop func()) {
	t.Helper()
	mgrOpts := env().ManagerOptions()
	mgrOpts.Cache = cache.Options{ByObject: leasecontroller.CacheByObject()}
	mgr := env().NewManager(t, cfg, mgrOpts)
	opts.Registry = registry
	if opts.EventRecorder == nil {
		rec, err := eventrecorder.New(mgr, "sharder")
		if err != nil {
			t.Fatalf("creating the event recorder: %v", err)
		}
		opts.EventRecorder = rec
	}
	c, err := assign.New(opts)
	if err != nil {
		t.Fatalf("creating controller: %v", err)
	}
	if err := c.SetupWithManager(mgr); err != nil {
		t.Fatalf("setting up controller: %v", err)
	}
	if setup != nil {
		if err := setup(mgr); err != nil {
			t.Fatalf("setting up: %v", err)
		}
	}
	return testenv.StartManager(t, mgr)
}

// newRing creates a ring named after the test namespace that shards
// ConfigMaps of that namespace only. mutate may change the spec.
func newRing(t testing.TB, ns string, mutate func(*v1alpha1.ControllerRingSpec)) *v1alpha1.ControllerRing {
	t.Helper()
	r := &v1alpha1.ControllerRing{
		ObjectMeta: metav1.ObjectMeta{Name: ns},
		Spec: v1alpha1.ControllerRingSpec{
			LeaseNamespace: ns,
			Resources:      []v1alpha1.RingResource{{Resource: "configmaps"}},
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{
				v1alpha1.LabelNamespaceName: ns,
			}},
			DrainTimeout: &metav1.Duration{Duration: time.Hour},
		},
	}
	if mutate != nil {
		mutate(&r.Spec)
	}
	ctx := context.Background()
	if err := env().Client.Create(ctx, r); err != nil {
		t.Fatalf("creating ring: %v", err)
	}
	t.Cleanup(func() { _ = env().Client.Delete(context.Background(), r) })
	return r
}

func members(state membership.State, ids ...string) []membership.Member {
	out := make([]membership.Member, 0, len(ids))
	for _, id := range ids {
		// A gone instance's Lease is held by the sharder, as the lease
		// controller holds it before its objects move.
		out = append(out, membership.Member{ID: id, State: state, Movable: state.Gone()})
	}
	return out
}

var (
	ringsMu sync.Mutex
	rings   = map[string]ring.Ring{}
)

// expected returns the instance the consistent-hash ring of ready picks for
// a ConfigMap.
func expected(t testing.TB, ready []string, ns, name string) string {
	t.Helper()
	id := strings.Join(ready, ",")
	ringsMu.Lock()
	rg, ok := rings[id]
	if !ok {
		ms := make([]ring.Member, 0, len(ready))
		for _, id := range ready {
			ms = append(ms, ring.Member{ID: id, VirtualNodes: v1alpha1.DefaultVirtualNodes})
		}
		var err error
		if rg, err = ring.New(v1alpha1.AlgorithmConsistentHash, ms); err != nil {
			ringsMu.Unlock()
			t.Fatalf("building ring: %v", err)
		}
		rings[id] = rg
	}
	ringsMu.Unlock()
	got, err := rg.Lookup(ring.ObjectKey("", "ConfigMap", ns, name))
	if err != nil {
		t.Fatalf("looking up: %v", err)
	}
	return got
}

func createConfigMaps(t testing.TB, ns, prefix string, n int) []string {
	t.Helper()
	names := make([]string, 0, n)
	for i := range n {
		name := fmt.Sprintf("%s-%d", prefix, i)
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		if err := env().Client.Create(context.Background(), cm); err != nil {
			t.Fatalf("creating ConfigMap: %v", err)
		}
		names = append(names, name)
	}
	return names
}

// labelsOf returns the labels of every ConfigMap of ns by name.
func labelsOf(g Gomega, ns string) map[string]map[string]string {
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("ConfigMapList"))
	g.Expect(env().Client.List(context.Background(), list, client.InNamespace(ns))).To(Succeed())
	out := map[string]map[string]string{}
	for _, o := range list.Items {
		if o.Name == "kube-root-ca.crt" {
			continue
		}
		out[o.Name] = o.Labels
	}
	return out
}

// assigned returns a check for Eventually: every ConfigMap of names in ns
// carries the shard label with the instance instanceOf gives it.
func assigned(ns string, names []string, instanceOf func(name string) string) func(Gomega) {
	return func(g Gomega) {
		got := labelsOf(g, ns)
		for _, name := range names {
			g.Expect(got[name]).To(HaveKeyWithValue(v1alpha1.ShardLabel(ns), instanceOf(name)), name)
		}
	}
}

// on places every object on instance id (for assigned).
func on(id string) func(name string) string {
	return func(string) string { return id }
}

// placed places objects as the ring of the ready instances does (for
// assigned).
func placed(t testing.TB, ns string, ready ...string) func(name string) string {
	return func(name string) string { return expected(t, ready, ns, name) }
}

// labelEvent is one observed state of an object's ring labels.
type labelEvent struct {
	name, shard     string
	drain           bool
	drainValue      string
	resourceVersion int64
	at              time.Time
}

// history records every state of the ring labels of a resource's objects in
// a namespace, as a watch delivers them.
type history struct {
	mu     sync.Mutex
	events []labelEvent
}

func watchHistory(t testing.TB, gvr schema.GroupVersionResource, ns, ringName string) *history {
	t.Helper()
	mc, err := metadata.NewForConfig(env().Config)
	if err != nil {
		t.Fatal(err)
	}
	h := &history{}
	inf := metadatainformer.NewFilteredMetadataInformer(mc, gvr, ns, 0, nil, nil).Informer()
	record := func(obj any) {
		m, ok := obj.(*metav1.PartialObjectMetadata)
		if !ok {
			return
		}
		rv, _ := strconv.ParseInt(m.ResourceVersion, 10, 64)
		h.mu.Lock()
		h.events = append(h.events, labelEvent{
			name: m.Name, shard: m.Labels[v1alpha1.ShardLabel(ringName)],
			drain: drain.Requested(m, ringName), drainValue: m.Labels[v1alpha1.DrainLabel(ringName)],
			resourceVersion: rv, at: time.Now(),
		})
		h.mu.Unlock()
	}
	_, _ = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    record,
		UpdateFunc: func(_, o any) { record(o) },
	})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go inf.RunWithContext(ctx)
	if !toolscache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("history watch did not sync")
	}
	return h
}

func (h *history) of(name string) []labelEvent {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []labelEvent
	for _, e := range h.events {
		if e.name == name {
			out = append(out, e)
		}
	}
	return out
}

// states lists the label states name went through, each as
// "<shard>/<drain value>" ("-" for no drain label), one per write the watch
// delivered.
func (h *history) states(name string) []string {
	var out []string
	for _, e := range h.of(name) {
		d := "-"
		if e.drain {
			d = e.drainValue
		}
		out = append(out, e.shard+"/"+d)
	}
	return out
}

func (h *history) drained(name string) bool {
	for _, e := range h.of(name) {
		if e.drain {
			return true
		}
	}
	return false
}

// acknowledger plays the instances of a ring: it acknowledges every drain of
// a ConfigMap in ns held by an instance for which ack returns true, as
// pkg/instance does (drain.Acknowledge).
func acknowledger(t testing.TB, ns, ringName string, ack func(instance string) bool) {
	t.Helper()
	acknowledgerWith(t, ns, ringName, ack, drain.Acknowledge)
}

// legacyAcknowledge acknowledges a drain as instances did before the
// hand-over: it removes both labels, whatever the drain names.
func legacyAcknowledge(ctx context.Context, c client.Client, obj client.Object, ringName string) error {
	patch := drain.LabelPatch(obj.GetResourceVersion(), map[string]*string{
		v1alpha1.ShardLabel(ringName): nil, v1alpha1.DrainLabel(ringName): nil,
	})
	return c.Patch(ctx, obj, client.RawPatch(types.MergePatchType, patch))
}

// acknowledgerWith is acknowledger with the acknowledgement acknowledge.
func acknowledgerWith(t testing.TB, ns, ringName string, ack func(instance string) bool,
	acknowledge func(context.Context, client.Client, client.Object, string) error) {
	t.Helper()
	mc, err := metadata.NewForConfig(env().Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	inf := metadatainformer.NewFilteredMetadataInformer(mc, configMaps, ns, 0, nil, func(o *metav1.ListOptions) {
		o.LabelSelector = v1alpha1.DrainLabel(ringName)
	}).Informer()
	handle := func(obj any) {
		m, ok := obj.(*metav1.PartialObjectMetadata)
		if !ok || !ack(m.Labels[v1alpha1.ShardLabel(ringName)]) {
			return
		}
		cp := m.DeepCopy()
		cp.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("ConfigMap"))
		err := acknowledge(ctx, env().Client, cp, ringName)
		if err != nil && !errors.Is(err, drain.ErrNotDraining) && ctx.Err() == nil {
			t.Logf("acknowledging %s: %v", m.Name, err)
		}
	}
	_, _ = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    handle,
		UpdateFunc: func(_, o any) { handle(o) },
	})
	go inf.RunWithContext(ctx)
}

func getRing(g Gomega, name string) *v1alpha1.ControllerRing {
	r := &v1alpha1.ControllerRing{}
	g.Expect(env().Client.Get(context.Background(), client.ObjectKey{Name: name}, r)).To(Succeed())
	return r
}
