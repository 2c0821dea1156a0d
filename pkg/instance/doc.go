// Package instance turns a controller-runtime controller into an instance of
// a ring: one of several copies of the controller, each reconciling only the
// objects the sharder assigned to it.
//
// Three things make a controller an instance, and this package provides each:
//
//   - The cache selects the instance's objects: NewCache reads the ring when
//     the manager is created and makes the cache its assignment unit needs,
//     the selector shard.sharder.dev/<ring>=<identity> on the ring's
//     resources for a ring of unit Objects, the instance's slots for a ring
//     of unit Slots. Plain client-go informers use WithTweakListOptions or
//     TweakListOptions (unit Objects).
//   - The instance holds its Lease: Setup adds the Lease holder to the
//     manager. Reconciles are admitted only while the Lease is held; on
//     shutdown the Lease is released after the reconciles in flight ended, so
//     the sharder moves the objects at once.
//   - Drains are acknowledged: Instance.Wrap wraps a reconciler so that an
//     object carrying the ring's drain label is handed over to the instance
//     the label names (shard label set to it, drain label removed, in one
//     patch; both labels removed for a drain that names no instance) instead
//     of reconciled, never while a reconcile of it still runs in this
//     instance, and so that an object assigned elsewhere is never
//     reconciled, even from a request queued before it moved.
//
// Notifier reports objects gained, drained and lost. LabelChild gives a new
// child its owner's shard label. Controllers on plain client-go acknowledge
// drains with drain.Acknowledge or drain.AcknowledgePatch.
//
// A typical main, the same for a ring of either unit:
//
//	opts := instance.Options{Ring: "my-ring", Lease: leaseholder.Options{Namespace: "my-system"}}
//	mgr, _ := ctrl.NewManager(cfg, ctrl.Options{
//		NewCache: instance.NewCache(opts, &corev1.ConfigMap{}),
//	})
//	inst, _ := instance.Setup(mgr, opts)
//	r, _ := inst.Wrap(&corev1.ConfigMap{}, &MyReconciler{Client: mgr.GetClient()})
//	_ = ctrl.NewControllerManagedBy(mgr).For(&corev1.ConfigMap{}).Complete(r)
//	_ = mgr.Start(ctx)
//
// # Slot mode
//
// A ring of unit Slots (spec.assignment.unit: Slots, docs/design.md §11)
// assigns slots, not objects: every object carries a slot label
// slot.sharder.dev/<ring> written once, and the sharder hands the ring's
// slots to its instances in a table in the ring's status. The main above
// serves it unchanged: NewCache finds the ring's unit and makes a cache of
// the instance's slots, and Setup finds that cache and runs the instance in
// slot mode (Instance.Unit tells which).
//
// A cache that does not fit the ring is refused with an error wrapping
// ErrModeMismatch: a cache NewCache made for another ring (Setup), a cache
// NewCache did not make for a ring of unit Slots (Setup, which reads the
// ring then, when it can), or a ring deleted and created again with another
// unit or slot count before the instance started (the start). In object
// mode the instance needs no permission on ControllerRings (a ring it
// cannot read, or not created yet, gives the cache of unit Objects).
//
// In slot mode the instance keeps a record of the slots it holds
// (slots.Record). Once it holds its Lease it reads the ring from the API
// server (never a cache), applies its table, and only then admits
// reconciles; it then follows the ring with a watch of that one ring and
// applies only tables newer than the last it acted on. Slots granted to it
// join the record and the cache starts watching them. Slots the table
// releases from it leave the record at once: no reconcile of their objects
// is admitted from then on, those in flight are cancelled (cause
// ErrSlotReleased) and waited for, and then the instance acknowledges the
// table's revision on its Lease (annotation sharder.dev/slots-acknowledged,
// a renewal brought forward) and the cache lets go of the slots. Wrap
// admits a reconcile only for an object whose slot label names a slot of
// the record, whatever the cache holds; drains do not exist in slot mode.
// LabelChild copies the owner's slot label. The record is dropped with the
// Lease: a process that starts again starts from a new read of the ring.
// The instance's service account needs get, list and watch on the ring
// (ControllerRings are cluster-scoped) besides the Lease permissions.
//
// On a ring whose slots are keyed by namespace, Options.ShardedListAndWatch
// selects the slots with the API server's shard selector on the namespace
// (Kubernetes 1.36 with the ShardedListAndWatch gate) instead of the slot
// label, so that the instance reconciles an object before the sharder
// labelled it.
package instance
