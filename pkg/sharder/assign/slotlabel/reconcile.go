package slotlabel

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/sharder-dev/sharder/pkg/drain"
	"github.com/sharder-dev/sharder/pkg/sharder/assign/internal/metacache"
	"github.com/sharder-dev/sharder/pkg/sharder/assign/internal/owners"
	"github.com/sharder-dev/sharder/pkg/slots"
)

// Reasons of the events on objects left without a slot.
const (
	// ReasonControllerNotInRing: the object's controller, or one further up
	// its chain, is of no resource of the ring (or the chain ends at an
	// object of a controlled resource without a controller).
	ReasonControllerNotInRing = "SlotControllerNotInRing"
	// ReasonControllerNotFound: a controller of the chain is gone, or was
	// recreated with another UID.
	ReasonControllerNotFound = "SlotControllerNotFound"
	// ReasonControllerSlotInvalid: the first labelled controller of the
	// chain carries a slot label that names no slot of the ring.
	ReasonControllerSlotInvalid = "SlotControllerSlotInvalid"
	// ReasonOwnershipCycle: the chain of controllers loops, or is longer
	// than owners.MaxOwnerDepth.
	ReasonOwnershipCycle = "SlotOwnershipCycle"
)

// childWrites bounds the concurrent label writes to one object's
// controlled objects.
const childWrites = 8

// noSlot is the slot of an object that is not labelled (now).
const noSlot = -1

func (l *Labeler) processNext(ctx context.Context) bool {
	it, quit := l.queue.Get()
	if quit {
		return false
	}
	defer l.queue.Done(it)
	after, err := l.reconcile(ctx, it)
	if err != nil {
		if ctx.Err() == nil {
			kv := []any{"kind", it.res.gvk.Kind, "object", klog.KRef(it.namespace, it.name)}
			if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
				// Changed or gone meanwhile: decided again from the cache.
				l.logger.V(1).Info("Object changed meanwhile, deciding again", append(kv, "error", err.Error())...)
			} else {
				l.logger.Error(err, "Cannot label object with its slot", kv...)
			}
		}
		l.queue.AddRateLimited(it)
		return true
	}
	l.queue.Forget(it)
	if after > 0 {
		l.queue.AddAfter(it, after)
	}
	return true
}

// reconcile labels one object, and its controlled objects in the caches
// before it, with its slot. It returns when to look at the object again,
// zero for only when an event says so.
func (l *Labeler) reconcile(ctx context.Context, it item) (time.Duration, error) {
	obj, ok := it.res.cache.Get(it.namespace, it.name)
	if !ok || obj.DeletionTimestamp != nil || l.stale(obj) {
		return 0, nil // labelled, gone, being deleted, or just written
	}
	var slot int
	if it.res.main {
		if !l.selected(obj.Namespace) {
			return 0, nil
		}
		slot = l.mainSlot(it.res, obj)
	} else {
		var after time.Duration
		var err error
		if slot, after, err = l.controlledSlot(ctx, it.res, obj); err != nil || slot == noSlot {
			return after, err
		}
	}
	return 0, l.labelTree(ctx, it.res, obj, slot)
}

// mainSlot is the slot of a main object of res.
func (l *Labeler) mainSlot(res *resource, obj metav1.Object) int {
	return slots.ForMainObject(l.spec, res.gvk.Group, res.gvk.Kind, obj.GetNamespace(), obj.GetName())
}

// controlledSlot finds the slot of a controlled object: up its chain of
// controllers, the slot label of the first controller that has one (read
// from the API server, since a labelled object is in no cache), or the slot
// of the main object the chain reaches while unlabelled (the slot that
// object is labelled with: a function of its key alone). It returns noSlot
// when the object is to be left alone, with a delay when it is to be looked
// at again then.
func (l *Labeler) controlledSlot(ctx context.Context, res *resource, obj *metacache.Object) (int, time.Duration, error) {
	visited := map[types.UID]bool{obj.UID: true}
	var cur metav1.Object = obj
	curKind := res.gvk.Kind
	for range owners.MaxOwnerDepth {
		ref := metav1.GetControllerOfNoCopy(cur)
		if ref == nil {
			if cur == metav1.Object(obj) {
				// Not of the ring: a controlled resource's objects belong to
				// it through their controller only.
				l.logger.V(1).Info("Object has no controller: not of the ring, left without a slot",
					"kind", res.gvk.Kind, "object", klog.KObj(obj))
				return noSlot, 0, nil
			}
			l.report(res, obj, ReasonControllerNotInRing, "its chain of controllers ends at %s %s, which has no controller: it is of no main object of the ring",
				curKind, klog.KObj(cur))
			return noSlot, 0, nil
		}
		owner, ok := l.resourceOf(ref)
		if !ok {
			l.report(res, obj, ReasonControllerNotInRing, "its controller %s %s (%s) is of no resource of the ring",
				ref.Kind, ref.Name, ref.APIVersion)
			return noSlot, 0, nil
		}
		namespace := cur.GetNamespace()
		if !owner.namespaced {
			namespace = ""
		}

		// A controller still without a slot label is in the caches,
		// unless they are behind.
		var next metav1.Object
		if cached, ok := owner.cache.Get(namespace, ref.Name); ok && (ref.UID == "" || cached.UID == ref.UID) {
			next = cached
		} else {
			got, err := l.opts.Client.Resource(owner.gvr).Namespace(namespace).Get(ctx, ref.Name, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err) || err == nil && ref.UID != "" && got.UID != ref.UID:
				l.report(res, obj, ReasonControllerNotFound, "its controller %s %s is gone", ref.Kind, klog.KRef(namespace, ref.Name))
				return noSlot, 0, nil
			case err != nil:
				return noSlot, 0, fmt.Errorf("reading controller %s %s: %w", ref.Kind, klog.KRef(namespace, ref.Name), err)
			}
			if value, labelled := got.Labels[l.slotLabel]; labelled {
				slot, err := slots.ParseLabel(value, l.count)
				if err != nil {
					l.report(res, obj, ReasonControllerSlotInvalid, "its controller %s %s carries the slot label %q, which names no slot of the ring: %v",
						ref.Kind, klog.KObj(got), value, err)
					return noSlot, 0, nil
				}
				if ok, wait := l.selectedOrWait(got.Namespace); !ok {
					return noSlot, wait, nil
				}
				return slot, 0, nil
			}
			next = got
		}

		if visited[next.GetUID()] {
			l.report(res, obj, ReasonOwnershipCycle, "its chain of controllers loops at %s %s", ref.Kind, klog.KObj(next))
			return noSlot, 0, nil
		}
		visited[next.GetUID()] = true
		if next.GetDeletionTimestamp() != nil {
			// Being deleted: its deletion takes the object along, or
			// orphans it (which removes the reference and wakes it).
			l.logger.V(1).Info("Controller is being deleted: object left without a slot",
				"kind", res.gvk.Kind, "object", klog.KObj(obj), "controller", klog.KObj(next))
			return noSlot, 0, nil
		}
		if owner.main {
			if ok, wait := l.selectedOrWait(next.GetNamespace()); !ok {
				return noSlot, wait, nil
			}
			return l.mainSlot(owner, next), 0, nil
		}
		cur, curKind = next, owner.gvk.Kind
	}
	l.report(res, obj, ReasonOwnershipCycle, "its chain of controllers is more than %d deep", owners.MaxOwnerDepth)
	return noSlot, 0, nil
}

// selectedOrWait reports whether the ring selects namespace, the namespace
// of the object a controlled object takes its slot from. When the caches
// have not seen the namespace yet, it answers false with
// Options.Recheck: the namespace's arrival queues its objects, and
// the delay covers an arrival that came first.
func (l *Labeler) selectedOrWait(namespace string) (bool, time.Duration) {
	if namespace == "" {
		return true, 0
	}
	if _, known := l.namespaces.GetNamespace(namespace); !known {
		return false, l.opts.Recheck
	}
	return l.selected(namespace), 0
}

// resourceOf returns the resource of the ring ref points to; false when
// it is of none, or its apiVersion is malformed.
func (l *Labeler) resourceOf(ref *metav1.OwnerReference) (*resource, bool) {
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	if err != nil {
		return nil, false
	}
	res, ok := l.byGK[schema.GroupKind{Group: gv.Group, Kind: ref.Kind}]
	return res, ok
}

// child is a controlled object of the caches below an object.
type child struct {
	res *resource
	obj *metacache.Object
}

// descendants returns the cached objects whose chain of controllers leads
// to root through cached objects only (all still without a slot label),
// parents before their children. Objects being deleted, and their own
// controlled objects, are left out.
func (l *Labeler) descendants(root *metacache.Object) []child {
	if len(l.controlled) == 0 {
		return nil
	}
	caches := make([]*metacache.Cache, len(l.controlled))
	for i, res := range l.controlled {
		caches[i] = res.cache
	}
	found := metacache.Descendants(root, caches, func(m *metacache.Object) bool { return m.DeletionTimestamp != nil })
	out := make([]child, len(found))
	for i, d := range found {
		out[i] = child{res: l.controlled[d.Cache], obj: d.Object}
	}
	return out
}

// labelTree writes slot into the slot label of obj's controlled objects in
// the caches, then of obj: an instance that starts on obj finds its
// children labelled, in its cache. A conflict on a child fails the whole
// tree before obj is written; obj is decided again.
func (l *Labeler) labelTree(ctx context.Context, res *resource, obj *metacache.Object, slot int) error {
	value := strconv.Itoa(slot)
	var g errgroup.Group
	g.SetLimit(childWrites)
	for _, c := range l.descendants(obj) {
		if l.stale(c.obj) {
			continue
		}
		g.Go(func() error {
			err := l.patch(ctx, c.res, c.obj, value)
			if err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("labelling controlled %s %s: %w", c.res.gvk.Kind, klog.KObj(c.obj), err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	return l.patch(ctx, res, obj, value)
}

// patch writes the slot label value on obj, locked on its cached
// resourceVersion: a decision taken on a stale cache fails with a conflict.
func (l *Labeler) patch(ctx context.Context, res *resource, obj *metacache.Object, value string) error {
	if obj.ResourceVersion == "" {
		return fmt.Errorf("%s %s has no resourceVersion to lock the write on", res.gvk.Kind, klog.KObj(obj))
	}
	data := drain.LabelPatch(obj.ResourceVersion, map[string]*string{l.slotLabel: &value})
	out, err := l.opts.Writer.Resource(res.gvr).Namespace(obj.Namespace).Patch(ctx, obj.Name, types.MergePatchType, data,
		metav1.PatchOptions{FieldManager: l.opts.FieldManager})
	res.cache.NotePatch(err)
	if err != nil {
		return err
	}
	l.noteWrite(obj.UID, out.ResourceVersion)
	l.logger.V(1).Info("Labelled object with its slot", "kind", res.gvk.Kind, "object", klog.KObj(obj), "slot", value)
	return nil
}

// stale reports whether the cache still holds a version of obj older than
// the labeler's write to it: that version is labelled already.
func (l *Labeler) stale(obj *metacache.Object) bool {
	v, ok := l.written.Load(obj.UID)
	if !ok {
		return false
	}
	have, err := strconv.ParseInt(obj.ResourceVersion, 10, 64)
	written, isInt := v.(int64)
	return err == nil && isInt && have < written
}

func (l *Labeler) noteWrite(uid types.UID, resourceVersion string) {
	if rv, err := strconv.ParseInt(resourceVersion, 10, 64); err == nil {
		l.written.Store(uid, rv)
	}
}

// report says once per object and reason why obj is left without a slot:
// in the log, and in a warning event on obj when a recorder is set.
func (l *Labeler) report(res *resource, obj *metacache.Object, reason, format string, args ...any) {
	if prev, loaded := l.reported.Swap(obj.UID, reason); loaded && prev == reason {
		return
	}
	msg := fmt.Sprintf("Left without a slot of ring %s: ", l.ring) + fmt.Sprintf(format, args...)
	l.logger.Info("Controlled object left without a slot", "kind", res.gvk.Kind, "object", klog.KObj(obj), "reason", reason, "message", msg)
	if l.opts.Recorder == nil {
		return
	}
	ref := &metav1.PartialObjectMetadata{
		TypeMeta:   metav1.TypeMeta{APIVersion: res.gvk.GroupVersion().String(), Kind: res.gvk.Kind},
		ObjectMeta: metav1.ObjectMeta{Namespace: obj.Namespace, Name: obj.Name, UID: obj.UID, ResourceVersion: obj.ResourceVersion},
	}
	l.opts.Recorder.Eventf(ref, corev1.EventTypeWarning, reason, "%s", msg)
}
