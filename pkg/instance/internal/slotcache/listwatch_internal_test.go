package slotcache

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/watchlist"
	"sigs.k8s.io/controller-runtime/pkg/cache"
)

// TestGroupInformerDeclinesStreaming: whatever a group cache's informer
// wraps its ListerWatcher in (the shard selector of a sharded kind among
// them), the ListerWatcher the informer gets tells client-go's reflector
// that it does not support streaming lists.
func TestGroupInformerDeclinesStreaming(t *testing.T) {
	for _, sharded := range []bool{false, true} {
		var got toolscache.ListerWatcher
		c := &Cache{
			base: cache.Options{Scheme: scheme.Scheme, NewInformer: func(lw toolscache.ListerWatcher, obj runtime.Object, resync time.Duration, ix toolscache.Indexers) toolscache.SharedIndexInformer {
				got = lw
				return toolscache.NewSharedIndexInformer(lw, obj, resync, ix)
			}},
			count: 256,
			ring:  map[schema.GroupKind]ringKind{{Kind: "ConfigMap"}: {obj: &corev1.ConfigMap{}, namespaced: true, sharded: sharded}},
		}
		lw := &toolscache.ListWatch{
			ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
				return &corev1.ConfigMapList{}, nil
			},
			WatchFuncWithContext: func(context.Context, metav1.ListOptions) (watch.Interface, error) { return watch.NewFake(), nil },
		}
		c.groupInformer(&group{slots: []int{0, 1}}, sharded)(lw, &corev1.ConfigMap{}, 0, toolscache.Indexers{})
		if got == nil {
			t.Fatalf("sharded %t: the base NewInformer was not called", sharded)
		}
		if !watchlist.DoesClientNotSupportWatchListSemantics(got) {
			t.Errorf("sharded %t: the informer's ListerWatcher (%T) lets the reflector stream its list", sharded, got)
		}
	}
}
