package assign

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	metadatafake "k8s.io/client-go/metadata/fake"

	"github.com/sharder-dev/sharder/pkg/sharder/assign/internal/metacache"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// An unassigned object outside the ring's namespaces is never assigned, so
// the sharder keeps no first-seen time for it: that entry would stay as long
// as the object exists.
func TestFirstSeenOnlyForSelectedObjects(t *testing.T) {
	r := &ringAssigner{
		c:          &Controller{opts: Options{Clock: clock.RealClock{}}},
		name:       "web",
		shardLabel: v1alpha1.ShardLabel("web"),
		drainLabel: v1alpha1.DrainLabel("web"),
		queue:      workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[item]()),
		status:     make(chan struct{}, 1),
	}
	defer r.queue.ShutDown()
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
	r.namespaces = metacache.NewNamespaces(metadatafake.NewSimpleMetadataClient(scheme, namespaces...), nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.namespaces.Run(ctx)
	if !toolscache.WaitForCacheSync(ctx.Done(), r.namespaces.HasSynced) {
		t.Fatal("Namespace cache not synced")
	}
	cfg := &ringConfig{name: "web", selector: labels.SelectorFromSet(labels.Set{"team": "web"})}
	r.cfg.Store(cfg)
	w := &resourceCache{res: resource{gk: schema.GroupKind{Kind: "ConfigMap"}, main: true, namespaced: true}}

	in := &metacache.Object{Namespace: "in", Name: "a", UID: "u-in"}
	out := &metacache.Object{Namespace: "out", Name: "a", UID: "u-out"}
	r.mainChanged(w, nil, in)
	r.mainChanged(w, nil, out)
	if _, ok := r.seen.Load(in.UID); !ok {
		t.Error("no first-seen time for an unassigned object of the ring")
	}
	if _, ok := r.seen.Load(out.UID); ok {
		t.Error("first-seen time kept for an object outside the ring's namespaces")
	}
}
