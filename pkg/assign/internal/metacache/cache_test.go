package metacache

import (
	"context"
	"errors"
	"iter"
	"slices"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	metadatafake "k8s.io/client-go/metadata/fake"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

var configMaps = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}

// startCache runs a cache of ConfigMaps holding objs until the test ends.
func startCache(t *testing.T, opts Options, objs ...runtime.Object) *Cache {
	t.Helper()
	scheme := metadatafake.NewTestScheme()
	metav1.AddMetaToScheme(scheme)
	c := NewObjects(metadatafake.NewSimpleMetadataClient(scheme, objs...), configMaps, NewObjectTransform("web"), opts)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go c.Run(ctx)
	if !toolscache.WaitForCacheSync(ctx.Done(), c.HasSynced) {
		t.Fatal("cache not synced")
	}
	return c
}

// configMap is a ConfigMap of namespace ns, controlled by the object with
// UID controller unless it is empty.
func configMap(name string, controller types.UID) *metav1.PartialObjectMetadata {
	m := &metav1.PartialObjectMetadata{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("u-" + name)},
	}
	if controller != "" {
		m.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "Deployment", Name: "d", UID: controller, Controller: ptr.To(true)}}
	}
	return m
}

func names(seq iter.Seq[*Object]) []string {
	var out []string
	for o := range seq {
		out = append(out, o.Name)
	}
	slices.Sort(out)
	return out
}

func TestCacheGetListAndByController(t *testing.T) {
	c := startCache(t, Options{IndexByController: true}, configMap("a", "d1"), configMap("b", "d1"), configMap("c", ""))
	if o, ok := c.Get("ns", "a"); !ok || o.UID != "u-a" || o.ControllerUID() != "d1" {
		t.Errorf("Get(ns, a) = %+v, %v", o, ok)
	}
	if _, ok := c.Get("", "a"); ok {
		t.Error("Get found a namespaced object without its namespace")
	}
	if got := names(c.List()); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Errorf("List = %v", got)
	}
	if got := names(c.ByController("d1")); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("ByController(d1) = %v", got)
	}
	unindexed := startCache(t, Options{}, configMap("a", "d1"))
	if got := names(unindexed.ByController("d1")); got != nil {
		t.Errorf("ByController without the index = %v, want nothing", got)
	}
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
