// Package instance turns a controller-runtime controller into an instance of
// a ring: one of several copies of the controller, each reconciling only the
// objects the sharder assigned to it.
//
// Three things make a controller an instance, and this package provides each:
//
//   - The cache selects the instance's objects: CacheByObject (or
//     CacheOptions) adds the selector shard.sharder.dev/<ring>=<identity> for
//     the ring's resources to the manager's cache options. Plain client-go
//     informers use WithTweakListOptions or TweakListOptions.
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
// A typical main:
//
//	id, _ := instance.DefaultIdentity()
//	mgr, _ := ctrl.NewManager(cfg, ctrl.Options{
//		Cache: instance.CacheOptions("my-ring", id, &corev1.ConfigMap{}),
//	})
//	inst, _ := instance.Setup(mgr, instance.Options{Ring: "my-ring", LeaseNamespace: "my-system", Identity: id})
//	r, _ := inst.Wrap(&corev1.ConfigMap{}, &MyReconciler{Client: mgr.GetClient()})
//	_ = ctrl.NewControllerManagedBy(mgr).For(&corev1.ConfigMap{}).Complete(r)
//	_ = mgr.Start(ctx)
package instance
