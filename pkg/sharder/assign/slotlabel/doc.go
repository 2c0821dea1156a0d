// Package slotlabel is the sharder's slot labeler: for one ring of unit
// Slots it writes every object's slot label, slot.sharder.dev/<ring>, once
// (docs/design.md §11, "The slot of an object" and "Who writes the slot
// label").
//
// Use:
//
//	l, err := slotlabel.New(slotlabel.Options{Ring: ring, Client: meta, Mapper: mapper})
//	err = l.Start(ctx) // blocks until ctx is done; a manager.Runnable (leader only)
//
// What it does and promises:
//
//   - It watches the metadata of the ring's main and controlled resources
//     with the label selector !slot.sharder.dev/<ring>, in
//     metadata-only caches (package metacache), so it keeps in memory only
//     the objects still without a slot label: an object leaves its cache as
//     soon as it is labelled, by the labeler or anyone else.
//   - A main object in a namespace the ring selects (a cluster-scoped one
//     always) gets slots.ForMainObject: a function of its hash key or
//     namespace and the ring's slot count only.
//   - A controlled object takes the slot of its controller, following the
//     chain of controller ownerReferences as object mode does: the first
//     controller of the chain that carries a slot label gives its label
//     (read from the API server, since a labelled object is in no cache of
//     the labeler); a chain that reaches a main object still without one
//     gives that object's slot, the one it is about to be labelled with (a
//     function of its key alone), so no controlled object waits for its
//     controller's write. Controllers still without a slot label are read
//     from the caches, others from the API server. When an object leaves
//     the caches (labelled or deleted), the objects it controls are looked
//     at again.
//   - Children first: before it labels an object it labels the object's
//     controlled objects in its caches, so that an instance that starts on
//     the object finds its children in its cache (as object mode relabels
//     controlled objects before their owner, §5).
//   - Every write is a JSON merge patch of the slot label alone, locked on
//     the resourceVersion the decision was taken on: a decision taken on a
//     stale cache fails with a conflict and is taken again from the cache.
//     An object that already carries a slot label, whatever its value, is
//     never written: it is in no cache of the labeler.
//   - Objects being deleted are left alone, and so are their controlled
//     objects while they wait for the owner.
//   - A controlled object whose controller is not a resource of the ring,
//     is gone, carries a slot label that names no slot of the ring, or
//     whose chain loops, is left without a slot and reported once: a log
//     line and, with Options.Recorder, a warning event on the object. An
//     object of a controlled resource without a controller is not of the
//     ring and is left alone quietly.
//
// A Labeler serves one generation of the ring's spec: its resources and
// namespaceSelector are read by New. A ring's slot count and key never
// change; when its resources or namespaceSelector do, stop the Labeler and
// start a new one (its caches hold the unlabelled objects only, so a
// restart costs one list of them).
package slotlabel
