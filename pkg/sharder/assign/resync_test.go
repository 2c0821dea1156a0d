package assign

import (
	"context"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	metadatafake "k8s.io/client-go/metadata/fake"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/ring"
	"github.com/sharder-dev/sharder/pkg/sharder/assign/internal/metacache"
	"github.com/sharder-dev/sharder/pkg/sharder/ringbuilds"
)

// A resync queues only the objects whose reconcile would do something: an
// object on its instance, with nothing written to it since the cache last
// saw it, stays out of the work queue, so that a ring of a million objects
// neither reconciles each of them every resync period nor keeps room for
// all of them in the queue.
func TestResyncQueuesOnlyObjectsThatNeedWork(t *testing.T) {
	const ringName = "web"
	r := &ringAssigner{
		c:          &Controller{opts: Options{Clock: clock.RealClock{}}},
		name:       ringName,
		shardLabel: v1alpha1.ShardLabel(ringName),
		drainLabel: v1alpha1.DrainLabel(ringName),
		queue:      workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[item]()),
		status:     make(chan struct{}, 1),
	}
	defer r.queue.ShutDown()
	cfg := &ringConfig{name: ringName, algorithm: v1alpha1.AlgorithmConsistentHash, virtualNodes: v1alpha1.DefaultVirtualNodes,
		drainTimeout: time.Hour, selector: labels.SelectorFromSet(labels.Set{"team": "web"})}
	r.cfg.Store(cfg)
	ready := []membership.Member{{ID: "a", State: membership.StateReady}, {ID: "b", State: membership.StateReady}}
	view, _, err := buildView(new(ringbuilds.Builds), cfg, ready)
	if err != nil {
		t.Fatal(err)
	}
	r.view.Store(view)

	gk := schema.GroupKind{Kind: "ConfigMap"}
	target := func(name string) string {
		id, err := view.ring.Lookup(ring.ObjectKey(gk.Group, gk.Kind, "in", name))
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	other := func(id string) string {
		if id == "a" {
			return "b"
		}
		return "a"
	}
	object := func(namespace, name, instance string) runtime.Object {
		m := &metav1.PartialObjectMetadata{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: types.UID(namespace + "-" + name), ResourceVersion: "5"},
		}
		if instance != "" {
			m.Labels = map[string]string{r.shardLabel: instance}
		}
		return m
	}
	objects := []runtime.Object{
		object("in", "home", target("home")),
		object("in", "written", target("written")), // the sharder wrote it since the cache saw it
		object("in", "away", other(target("away"))),
		object("in", "new", ""),
		object("out", "elsewhere", ""), // outside the ring's namespaces
	}
	var namespaces []runtime.Object
	for name, team := range map[string]string{"in": "web", "out": "db"} {
		namespaces = append(namespaces, &metav1.PartialObjectMetadata{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"},
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"team": team}},
		})
	}
	scheme := metadatafake.NewTestScheme()
	if err := metav1.AddMetaToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	client := metadatafake.NewSimpleMetadataClient(scheme, append(objects, namespaces...)...)
	r.namespaces = metacache.NewNamespaces(client, nil)
	gvr := schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	w := &resourceCache{res: resource{gvr: gvr, gk: gk, main: true, namespaced: true},
		cache: metacache.NewObjects(client, gvr, metacache.NewObjectTransform(ringName), metacache.Options{})}
	r.mains = []*resourceCache{w}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.namespaces.Run(ctx)
	go w.cache.Run(ctx)
	if !toolscache.WaitForCacheSync(ctx.Done(), r.namespaces.HasSynced, w.cache.HasSynced) {
		t.Fatal("caches not synced")
	}
	r.noteWrite("in-written", "6")

	r.resync()
	var queued []string
	for r.queue.Len() > 0 {
		it, _ := r.queue.Get()
		queued = append(queued, it.namespace+"/"+it.name)
		r.queue.Done(it)
	}
	slices.Sort(queued)
	if want := []string{"in/away", "in/new", "in/written"}; !slices.Equal(queued, want) {
		t.Errorf("resync queued %v, want %v", queued, want)
	}

	// Once the cache holds the sharder's write, the object needs nothing.
	r.noteWrite("in-written", "5")
	r.resync()
	if r.queue.Len() != 2 {
		t.Errorf("resync queued %d objects once the cache caught up, want 2 (away and new)", r.queue.Len())
	}
}
