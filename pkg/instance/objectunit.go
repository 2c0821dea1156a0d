package instance

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/drain"
	"github.com/sharder-dev/sharder/pkg/instance/internal/inflight"
	"github.com/sharder-dev/sharder/pkg/slots"
)

// objectUnit is the unit of a ring of unit Objects: an object is the
// instance's while it carries the instance's shard label, and it leaves
// through a drain the instance acknowledges (docs/design.md §5).
type objectUnit struct{ inst *Instance }

var _ unit = objectUnit{}

func (u objectUnit) owns(_ schema.GroupKind, obj metav1.Object) bool {
	return obj.GetLabels()[v1alpha1.ShardLabel(u.inst.opts.Ring)] == u.inst.opts.Identity
}

// reconcile reads the object from the cache and calls next when it is
// assigned here, acknowledges its drain when one is requested, and asks
// the API server about an object the cache does not hold (reconciler.absent).
func (u objectUnit) reconcile(ctx context.Context, r *reconciler, req reconcile.Request, _ context.CancelCauseFunc) (reconcile.Result, error) {
	log := logf.FromContext(ctx)
	key := inflight.Key{GroupKind: r.gvk.GroupKind(), NamespacedName: req.NamespacedName}
	obj, ok := r.proto.DeepCopyObject().(client.Object)
	if !ok {
		return reconcile.Result{}, reconcile.TerminalError(fmt.Errorf("%T is not a client.Object", r.proto))
	}
	if err := r.inst.client.Get(ctx, req.NamespacedName, obj); err != nil {
		if !apierrors.IsNotFound(err) {
			return reconcile.Result{}, fmt.Errorf("reading %s %s: %w", r.gvk.Kind, req.NamespacedName, err)
		}
		return r.absent(ctx, req)
	}
	if !u.owns(r.gvk.GroupKind(), obj) {
		log.V(1).Info("Request dropped: object not assigned to this instance",
			"assignedTo", obj.GetLabels()[v1alpha1.ShardLabel(u.inst.opts.Ring)])
		return reconcile.Result{}, nil
	}
	if drain.Requested(obj, r.inst.opts.Ring) {
		return r.acknowledge(ctx, key, obj)
	}
	r.inst.handedOver.forget(key) // assigned here again: its departure is news again
	return r.next.Reconcile(ctx, req)
}

// updated: with the instance's selector on the cache, objects leave through
// OnDelete; updates that change the shard label only show up in caches
// without the selector.
func (u objectUnit) updated(gvk schema.GroupVersionKind, oldObj, newObj client.Object) {
	was, is := u.owns(gvk.GroupKind(), oldObj), u.owns(gvk.GroupKind(), newObj)
	switch {
	case !was && is:
		u.inst.notify(func(nt Notifier) { nt.OnGained(newObj) })
	case was && !is:
		u.left(gvk, newObj, true)
	}
}

// left: an object this instance acknowledged the drain of was drained;
// any other was lost, and its reconciles in flight are cancelled once it is
// known to be assigned elsewhere (Instance.cancelMoved).
func (u objectUnit) left(gvk schema.GroupVersionKind, obj client.Object, moved bool) {
	key := inflight.Key{GroupKind: gvk.GroupKind(), NamespacedName: client.ObjectKeyFromObject(obj)}
	if _, drained := u.inst.acked.LoadAndDelete(key); drained {
		u.inst.notify(func(n Notifier) { n.OnDrained(obj) })
		return
	}
	u.inst.cancelMoved(gvk, key, moved)
	u.inst.notify(func(n Notifier) { n.OnLost(obj) })
}

func (u objectUnit) labelChild(owner, child metav1.Object) bool {
	return LabelChild(u.inst.opts.Ring, owner, child)
}

func (u objectUnit) run(ctx context.Context) error {
	u.inst.reconciles.Open()
	u.inst.log.Info("Instance holds its Lease, reconciling")
	u.inst.checkWatchLag(ctx)
	<-ctx.Done()
	return nil
}

func (objectUnit) lost() {}

func (objectUnit) slotRecord() (slots.Record, bool) { return slots.Record{}, false }

// absent handles a request for an object the cache does not hold: deleted, or
// no longer assigned here.
func (r *reconciler) absent(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	key := inflight.Key{GroupKind: r.gvk.GroupKind(), NamespacedName: req.NamespacedName}
	if r.inst.handedOver.recent(key, r.inst.opts.Lease.Clock.Now()) {
		// This instance handed it over itself: it moved away, and its
		// deletion, if any, is no longer this instance's to reconcile.
		logf.FromContext(ctx).V(1).Info("Request dropped: object handed over by this instance")
		return reconcile.Result{}, nil
	}
	live, err := r.readLive(ctx, req)
	if apierrors.IsNotFound(err) {
		return r.next.Reconcile(ctx, req)
	}
	if err != nil {
		return reconcile.Result{}, err
	}
	// It exists: moved away, or assigned here and not yet in the cache (its
	// arrival queues a request of its own).
	logf.FromContext(ctx).V(1).Info("Request dropped: object not in this instance's cache",
		"assignedTo", live.GetLabels()[v1alpha1.ShardLabel(r.inst.opts.Ring)])
	return reconcile.Result{}, nil
}

// acknowledge answers a drain request once no other reconcile of the object
// runs in this instance.
func (r *reconciler) acknowledge(ctx context.Context, key inflight.Key, cached client.Object) (reconcile.Result, error) {
	log := logf.FromContext(ctx)
	ok, err := r.inst.reconciles.Drain(ctx, key)
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("waiting for reconciles of %s in flight: %w", key.NamespacedName, err)
	}
	if !ok {
		return reconcile.Result{}, nil // another controller of this instance acknowledges it
	}
	r.inst.acked.Store(key, struct{}{})
	obj := cached
	if cp, ok := cached.DeepCopyObject().(client.Object); ok {
		obj = cp
	}
	for attempt := 1; ; attempt++ {
		target, _ := drain.Target(obj, r.inst.opts.Ring)
		err := drain.Acknowledge(ctx, r.inst.client, obj, r.inst.opts.Ring)
		if err == nil {
			r.inst.handedOver.add(key, r.inst.opts.Lease.Clock.Now())
			if target != "" {
				log.Info("Drain acknowledged: object handed over", "object", klog.KObj(obj), "to", target)
			} else {
				log.Info("Drain acknowledged: object left to the sharder", "object", klog.KObj(obj))
			}
			return reconcile.Result{}, nil
		}
		if apierrors.IsNotFound(err) { // deleted meanwhile: nothing left to hand over
			r.inst.acked.Delete(key)
			return reconcile.Result{}, nil
		}
		if !apierrors.IsConflict(err) || attempt == acknowledgeAttempts {
			r.inst.acked.Delete(key)
			return reconcile.Result{}, err
		}
		// The object changed since the cache saw it: decide on its current
		// state.
		live, err := r.readLive(ctx, reconcile.Request{NamespacedName: key.NamespacedName})
		switch {
		case apierrors.IsNotFound(err):
			r.inst.acked.Delete(key)
			return reconcile.Result{}, nil
		case err != nil:
			r.inst.acked.Delete(key)
			return reconcile.Result{}, err
		case !r.inst.unit.owns(r.gvk.GroupKind(), live) || !drain.Requested(live, r.inst.opts.Ring):
			// Moved by the sharder, or the drain was withdrawn: the cache's
			// next event for it brings a fresh request.
			r.inst.acked.Delete(key)
			log.V(1).Info("Drain no longer requested", "object", klog.KObj(live))
			return reconcile.Result{}, nil
		}
		obj = live
	}
}
