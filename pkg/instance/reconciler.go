package instance

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/sharder-dev/sharder/pkg/instance/internal/inflight"
)

// acknowledgeAttempts bounds how often a drain acknowledgement is retried
// after conflicts within one request.
const acknowledgeAttempts = 3

// Wrap returns a reconciler for the ring's main resource of obj's kind (pass
// an empty object, e.g. &corev1.ConfigMap{}; unstructured objects and
// metav1.PartialObjectMetadata need their GroupVersionKind set) that runs
// next only for objects assigned to this instance. For each request it reads
// the object from the manager's cache and:
//
//   - assigned to this instance: calls next;
//   - carrying the ring's drain label: acknowledges the drain (drain.Acknowledge:
//     hands the object over to the instance the drain names, or removes both
//     labels for a drain that names none) instead of calling next, once no
//     other reconcile of the object runs in this instance; reconciles of the
//     object that arrive meanwhile are
//     retried after Options.RetryPeriod (and then dropped if it moved);
//   - assigned to another instance or to none: drops the request, even when it
//     was queued while the object was still assigned here;
//   - absent from the cache: asks the API server; if the object is gone,
//     calls next so that it can finish its deletion handling, otherwise (it
//     moved away) drops the request.
//
// No request is handled while the instance's watch is further behind than
// Options.Lease.MaxWatchLag (it is retried after Options.RetryPeriod), and the
// contexts of those in flight are cancelled then, their cause ErrStaleWatch.
//
// The context passed to next is cancelled, its cause ErrMoved, as soon as
// the instance sees the object assigned elsewhere (a move the instance did
// not acknowledge: a forced move after the ring's drainTimeout, or a move
// away from an instance the sharder counted dead), and, its cause
// ErrLeaseLost, when the instance loses its Lease. A reconciler that
// respects its context thus stops when it may no longer act on the object;
// the cancellation is as prompt as the instance's watches, not a fence.
//
// Wrapping every controller of the kind with the same Instance is what makes
// the drain wait for all of them. No reconcile is admitted before the
// instance holds its Lease (requests are retried after Options.RetryPeriod),
// none after it lost the Lease or began shutting down; shutdown waits for
// those in flight before the Lease is released. Call Wrap before the manager
// starts.
//
// In slot mode (a ring of unit Slots) there are no drains and no shard
// label: next runs only for an object whose slot label names a slot of the
// instance's record of the slots it holds, never by whether the cache still
// holds the object (with Options.ShardedListAndWatch, an object not
// labelled yet has its namespace's slot); other requests are dropped, not
// requeued. An object
// absent from the cache and gone from the API server is handed to next
// when the slot of its name (a main object's slot, slots.ForMainObject) is
// in the record. The context passed to next is also cancelled, its cause
// ErrSlotReleased, when the sharder asks for the release of the object's
// slot; the instance acknowledges the release only once next returned.
//
// Wrap returns an error when obj's kind is not in the manager's scheme.
func (i *Instance) Wrap(obj client.Object, next reconcile.Reconciler) (reconcile.Reconciler, error) {
	gvk, err := apiutil.GVKForObject(obj, i.mgr.GetScheme())
	if err != nil {
		return nil, fmt.Errorf("wrapping a reconciler of %T: %w", obj, err)
	}
	i.register(gvk, obj)
	return &reconciler{inst: i, gvk: gvk, proto: obj, next: next}, nil
}

type reconciler struct {
	inst  *Instance
	gvk   schema.GroupVersionKind
	proto client.Object
	next  reconcile.Reconciler
}

var _ reconcile.Reconciler = &reconciler{}

func (r *reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	key := inflight.Key{GroupKind: r.gvk.GroupKind(), NamespacedName: req.NamespacedName}
	log := logf.FromContext(ctx)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	admission, end := r.inst.reconciles.BeginCancellable(key, cancel)
	switch admission {
	case inflight.Admitted:
	case inflight.NotOpen:
		return reconcile.Result{RequeueAfter: r.inst.opts.RetryPeriod}, nil
	case inflight.Draining:
		// Retried rather than dropped: if the drain turns out withdrawn, the
		// change this request stands for still gets reconciled here; if the
		// object moved, the retry is dropped as not assigned.
		log.V(1).Info("Request deferred: the object's drain is being acknowledged")
		return reconcile.Result{RequeueAfter: r.inst.opts.RetryPeriod}, nil
	default:
		log.V(1).Info("Request dropped", "reason", admission.String())
		return reconcile.Result{}, nil
	}
	defer end()
	if !r.inst.watchCurrent() {
		// Admitted first, so that a watch falling behind from now on
		// cancels this reconcile (checkWatchLag) rather than miss it.
		log.V(1).Info("Request deferred: the instance's watch is behind the API server")
		return reconcile.Result{RequeueAfter: r.inst.opts.RetryPeriod}, nil
	}
	return r.inst.unit.reconcile(ctx, r, req, cancel)
}

// readLive reads the object's metadata from the API server.
func (r *reconciler) readLive(ctx context.Context, req reconcile.Request) (*metav1.PartialObjectMetadata, error) {
	live := &metav1.PartialObjectMetadata{}
	live.SetGroupVersionKind(r.gvk)
	if err := r.inst.apiReader.Get(ctx, req.NamespacedName, live); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, err
		}
		return nil, fmt.Errorf("reading %s %s from the API server: %w", r.gvk.Kind, req.NamespacedName, err)
	}
	return live, nil
}
