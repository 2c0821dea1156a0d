package instance

import (
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/sharder-dev/sharder/pkg/instance/internal/slotcache"
)

// NewSlotCacheFunc makes a slot cache of ring with count slots without
// reading the ring, as no user can: the tests of the checks that refuse a
// cache that does not fit the ring use it.
func NewSlotCacheFunc(ring string, count int, objects ...client.Object) cache.NewCacheFunc {
	return func(cfg *rest.Config, opts cache.Options) (cache.Cache, error) {
		return slotcache.New(cfg, slotcache.Options{Ring: ring, Count: count, Objects: objects, Cache: opts})
	}
}

// NewShardedSlotCacheFunc is NewSlotCacheFunc with objects selected by
// shard.
func NewShardedSlotCacheFunc(ring string, count int, objects ...client.Object) cache.NewCacheFunc {
	return func(cfg *rest.Config, opts cache.Options) (cache.Cache, error) {
		return slotcache.New(cfg, slotcache.Options{Ring: ring, Count: count, Objects: objects, Cache: opts, Sharded: objects})
	}
}

// SlotCacheOf returns mgr's slot cache; false when its cache is not one.
func SlotCacheOf(mgr manager.Manager) (*slotcache.Cache, bool) {
	sc, ok := mgr.GetCache().(*slotcache.Cache)
	return sc, ok
}
