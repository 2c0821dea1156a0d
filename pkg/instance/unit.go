package instance

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/sharder-dev/sharder/pkg/instance/internal/slotcache"
	"github.com/sharder-dev/sharder/pkg/slots"
)

// unit is how an instance admits work in its ring's assignment unit: by the
// shard label on each object and drains (objectUnit), or by its record of
// the slots it holds (slotUnit). Setup chooses it once, from the cache
// NewCache made from the ring's spec; everything else in the instance (the
// Lease, the gate of reconciles in flight, the watch-lag check, the bound
// on stopping, notifications) is the same for both.
type unit interface {
	// owns reports whether obj, of kind gk, is this instance's to
	// reconcile now.
	owns(gk schema.GroupKind, obj metav1.Object) bool
	// reconcile handles a request the gate admitted (the Lease held, the
	// watch current): it calls r.next for an object of this instance.
	// cancel cancels the request's context.
	reconcile(ctx context.Context, r *reconciler, req reconcile.Request, cancel context.CancelCauseFunc) (reconcile.Result, error)
	// updated is the cache's update of an object of kind gvk.
	updated(gvk schema.GroupVersionKind, oldObj, newObj client.Object)
	// left reports that obj is no longer this instance's: assigned
	// elsewhere (moved: the cache saw it so), or gone from its cache.
	left(gvk schema.GroupVersionKind, obj client.Object, moved bool)
	// labelChild gives child its owner's assignment label.
	labelChild(owner, child metav1.Object) bool
	// run is Instance.Start's part once the Lease is held: it opens the
	// gate when the instance may reconcile and returns when ctx ends, or
	// with an error when the ring no longer fits the instance.
	run(ctx context.Context) error
	// lost is told that the Lease was lost.
	lost()
	// slotRecord returns the record of the slots held; false in object mode.
	slotRecord() (slots.Record, bool)
}

// chooseUnit sets the instance's unit from the manager's cache: the slot
// unit for a slot cache of the ring, the object unit otherwise. A cache
// NewCache made from the ring is not checked against it again here (a
// slot-mode instance checks the ring when it starts); for any other cache
// the ring is read, if it can be, and a ring of unit Slots refused. The
// ring may not exist yet, and an instance in object mode need not be
// allowed to read it: only a ring read and found mismatched fails Setup.
func (i *Instance) chooseUnit() error {
	ring := i.opts.Ring
	switch c := i.mgr.GetCache().(type) {
	case *slotcache.Cache:
		if c.Ring() != ring {
			return fmt.Errorf("%w: the manager's slot cache is of ring %q, the instance of ring %q", ErrModeMismatch, c.Ring(), ring)
		}
		rc, err := newRingClient(i.mgr.GetConfig(), i.mgr.GetHTTPClient())
		if err != nil {
			return err
		}
		if !c.FromRing() {
			if err := i.checkRing(rc, c); err != nil {
				return err
			}
		}
		i.unit = newSlotUnit(i, c, rc)
		return nil
	case *objectCache:
		if c.ring != ring {
			return fmt.Errorf("%w: the manager's cache is of ring %q, the instance of ring %q", ErrModeMismatch, c.ring, ring)
		}
		i.unit = objectUnit{inst: i}
		if c.checked {
			return nil
		}
	}
	i.unit = objectUnit{inst: i}
	if i.opts.ShardedListAndWatch {
		return fmt.Errorf("%w: the manager's cache is not a slot cache: create the manager with NewCache: instance.NewCache(opts, <the ring's resources>...)",
			ErrShardedListAndWatch)
	}
	rc, err := newRingClient(i.mgr.GetConfig(), i.mgr.GetHTTPClient())
	if err != nil {
		return err
	}
	return i.checkRing(rc, nil)
}

// checkRing reads the ring, if it can, and refuses a cache that does not fit
// its unit: sc is the slot cache, nil for another cache.
func (i *Instance) checkRing(c client.Reader, sc *slotcache.Cache) error {
	r, err := readRing(context.Background(), c, i.opts.Ring)
	if err != nil {
		if !apierrors.IsNotFound(err) {
			i.log.V(1).Info("Could not read the ring at setup to check the cache against it", "error", err.Error())
		}
		return nil
	}
	return checkMode(r, sc)
}
