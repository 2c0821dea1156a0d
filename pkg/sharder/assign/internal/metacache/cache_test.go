package metacache

import (
	"context"
	"errors"
	"iter"
	"os"
	"slices"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/metadata"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/sharder-dev/sharder/internal/testenv"
	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

var configMaps = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}

var suite testenv.Suite // the control plane, started for the first test that calls env

func env() *testenv.Env { return suite.Env() }

func TestMain(m *testing.M) {
	os.Exit(testenv.Run(m, &suite, testenv.Options{}))
}

// startCache runs a cache of ConfigMaps against the test API server until
// the test ends.
func startCache(t *testing.T, opts Options) *Cache {
	t.Helper()
	client, err := metadata.NewForConfig(env().Config)
	if err != nil {
		t.Fatal(err)
	}
	c := NewObjects(client, configMaps, NewObjectTransform("web"), opts)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go c.Run(ctx)
	if !toolscache.WaitForCacheSync(ctx.Done(), c.HasSynced) {
		t.Fatal("cache not synced")
	}
	return c
}

// createConfigMap creates a ConfigMap in ns, controlled by owner unless it
// is nil, and returns its UID.
func createConfigMap(t *testing.T, ns, name string, owner *corev1.ConfigMap) types.UID {
	t.Helper()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if owner != nil {
		cm.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID, Controller: ptr.To(true)}}
	}
	if err := env().Client.Create(context.Background(), cm); err != nil {
		t.Fatal(err)
	}
	return cm.UID
}

// names returns the names of the objects of namespace ns in seq, sorted.
func names(seq iter.Seq[*Object], ns string) []string {
	var out []string
	for o := range seq {
		if o.Namespace == ns {
			out = append(out, o.Name)
		}
	}
	slices.Sort(out)
	return out
}

func TestCacheGetListAndByController(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	owner := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "owner"}}
	g.Expect(env().Client.Create(context.Background(), owner)).To(Succeed())
	a := createConfigMap(t, ns, "a", owner)
	createConfigMap(t, ns, "b", owner)
	createConfigMap(t, ns, "c", nil)

	c := startCache(t, Options{IndexByController: true})
	g.Eventually(func() []string { return names(c.List(), ns) }).Should(Equal([]string{"a", "b", "c", "owner"}))
	o, ok := c.Get(ns, "a")
	g.Expect(ok).To(BeTrue())
	g.Expect(o.UID).To(Equal(a))
	g.Expect(o.ControllerUID()).To(Equal(owner.UID))
	_, ok = c.Get("", "a")
	g.Expect(ok).To(BeFalse(), "Get found a namespaced object without its namespace")
	g.Expect(names(c.ByController(owner.UID), ns)).To(Equal([]string{"a", "b"}))

	unindexed := startCache(t, Options{})
	g.Expect(names(unindexed.ByController(owner.UID), ns)).To(BeEmpty(), "ByController without the index")
}

// A cache of named namespaces holds their objects alone, and finds a
// controller's objects in each of them.
func TestCacheOfNamedNamespaces(t *testing.T) {
	g := NewWithT(t)
	watched, other, outside := env().Namespace(t), env().Namespace(t), env().Namespace(t)
	var owners []*corev1.ConfigMap
	for _, ns := range []string{watched, other, outside} {
		owner := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "owner"}}
		g.Expect(env().Client.Create(context.Background(), owner)).To(Succeed())
		createConfigMap(t, ns, "child", owner)
		owners = append(owners, owner)
	}

	c := startCache(t, Options{IndexByController: true, Namespaces: []string{watched, other}})
	for _, ns := range []string{watched, other} {
		g.Eventually(func() []string { return names(c.List(), ns) }).Should(Equal([]string{"child", "owner"}), ns)
		_, ok := c.Get(ns, "child")
		g.Expect(ok).To(BeTrue(), ns)
	}
	g.Expect(names(c.List(), outside)).To(BeEmpty(), "objects of a namespace the cache does not watch")
	_, ok := c.Get(outside, "child")
	g.Expect(ok).To(BeFalse())
	g.Expect(names(c.ByController(owners[1].UID), other)).To(Equal([]string{"child"}))
	g.Expect(names(c.ByController(owners[2].UID), outside)).To(BeEmpty())
	g.Expect(c.Problem()).To(BeNil())
}

func TestCacheProblemOfForbiddenPatch(t *testing.T) {
	c := startCache(t, Options{})
	if p := c.Problem(); p != nil {
		t.Fatalf("Problem of a synced cache = %+v", p)
	}
	if c.NotePatch(nil) || c.NotePatch(errors.New("timeout")) {
		t.Error("NotePatch reports a change without a Forbidden answer")
	}
	forbidden := apierrors.NewForbidden(configMaps.GroupResource(), "a", errors.New("no"))
	if !c.NotePatch(forbidden) {
		t.Error("NotePatch(Forbidden) reports no change")
	}
	p := c.Problem()
	if p == nil || p.Reason != v1alpha1.ReasonResourceForbidden || p.Resource != configMaps.GroupResource() {
		t.Fatalf("Problem after a Forbidden patch = %+v", p)
	}
	if !c.NotePatch(nil) || c.Problem() != nil {
		t.Error("a successful patch does not clear the problem")
	}
}

func TestNotServed(t *testing.T) {
	gr := schema.GroupResource{Group: "example.com", Resource: "widgets"}
	p := NotServed(gr, errors.New("no match"))
	if p.Reason != v1alpha1.ReasonResourceNotServed || p.Resource != gr {
		t.Errorf("NotServed = %+v", p)
	}
}

// A cache has synced once its handlers were called for every object of its
// first list, not when the informer's store holds them: the ring's first
// pass, which decides about every object, then follows every call of the
// handlers for the first list, so they can leave those objects to it.
func TestHasSyncedWaitsForHandlers(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	createConfigMap(t, ns, "a", nil)
	client, err := metadata.NewForConfig(env().Config)
	if err != nil {
		t.Fatal(err)
	}
	c := NewObjects(client, configMaps, NewObjectTransform("web"), Options{})
	release := make(chan struct{})
	c.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: func(any) { <-release }})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go c.Run(ctx)
	g.Eventually(c.informers[0].HasSynced).Should(BeTrue())
	g.Consistently(c.HasSynced, "200ms").Should(BeFalse(), "synced while a handler had not seen the first list")
	close(release)
	g.Eventually(c.HasSynced).Should(BeTrue())
}
