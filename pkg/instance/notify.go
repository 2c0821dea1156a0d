package instance

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Notifier is told when objects of the ring come to this instance and leave
// it. Each object's story is Gained, then exactly one of Drained or Lost; it
// may start again if the object is assigned back later.
//
// In slot mode, OnGained reports an object of a slot the instance holds
// arriving in its cache, OnLost its deletion (or a change of its slot label
// past the slot label policy); OnDrained is never called, and
// the objects of a slot the instance lets go of leave silently (they were
// not deleted).
//
// Notifications are delivered synchronously from the instance cache's event
// delivery for the object's kind: for one kind they arrive one at a time, in
// the order the cache saw the changes; kinds are independent of each other.
// They are not ordered with respect to reconciles: a reconcile of a gained
// object may start before or after OnGained returns. A slow notifier delays
// only later notifications (events are buffered, reconciles are not held
// up); hand long work to a queue. The object passed is the cache's copy and
// must not be modified.
type Notifier interface {
	// OnGained: the object is now assigned to this instance. On start, every
	// object already assigned is reported once the cache has listed it.
	OnGained(obj client.Object)
	// OnDrained: this instance acknowledged the sharder's drain request and
	// the object left its cache: handed over to the instance the drain
	// named, or, for a drain naming none, left for the sharder to assign.
	OnDrained(obj client.Object)
	// OnLost: the object left this instance without its acknowledgement: it
	// was deleted, or the sharder moved it away at once (this instance was
	// considered dead, or the drain timed out).
	OnLost(obj client.Object)
}

// NotifierFuncs is a Notifier made of functions; nil ones are skipped.
type NotifierFuncs struct {
	GainedFunc  func(obj client.Object)
	DrainedFunc func(obj client.Object)
	LostFunc    func(obj client.Object)
}

var _ Notifier = NotifierFuncs{}

// OnGained calls GainedFunc if set.
func (f NotifierFuncs) OnGained(obj client.Object) {
	if f.GainedFunc != nil {
		f.GainedFunc(obj)
	}
}

// OnDrained calls DrainedFunc if set.
func (f NotifierFuncs) OnDrained(obj client.Object) {
	if f.DrainedFunc != nil {
		f.DrainedFunc(obj)
	}
}

// OnLost calls LostFunc if set.
func (f NotifierFuncs) OnLost(obj client.Object) {
	if f.LostFunc != nil {
		f.LostFunc(obj)
	}
}

// eventHandler turns the cache's events for one kind into notifications.
type eventHandler struct {
	inst *Instance
	gvk  schema.GroupVersionKind
}

var _ toolscache.ResourceEventHandler = eventHandler{}

func (h eventHandler) OnAdd(obj any, _ bool) {
	if o, ok := obj.(client.Object); ok && h.inst.assigned(h.gvk.GroupKind(), o) {
		h.inst.notify(func(n Notifier) { n.OnGained(o) })
	}
}

func (h eventHandler) OnUpdate(oldObj, newObj any) {
	o, okOld := oldObj.(client.Object)
	n, okNew := newObj.(client.Object)
	if !okOld || !okNew {
		return
	}
	h.inst.unit.updated(h.gvk, o, n)
}

func (h eventHandler) OnDelete(obj any) {
	if tombstone, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = tombstone.Obj
	}
	if o, ok := obj.(client.Object); ok && h.inst.assigned(h.gvk.GroupKind(), o) {
		h.inst.unit.left(h.gvk, o, false)
	}
}
