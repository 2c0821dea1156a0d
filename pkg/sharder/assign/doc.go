// Package assign is the sharder's assignment controller: for every
// ControllerRing it keeps metadata-only caches of the ring's resources and
// writes each object's instance into its shard label (docs/design.md §5).
//
// Most callers need two calls:
//
//	c, err := assign.New(assign.Options{Registry: registry})
//	err = c.SetupWithManager(mgr)
//
// The manager's scheme must know the sharder.dev/v1alpha1 types, and the
// lease controller (package leases) must publish ring membership into the
// same Registry.
//
// What the controller guarantees:
//
//   - It runs on the elected leader only. Per ring it watches the metadata of
//     every main and controlled resource (name, namespace, uid,
//     resourceVersion, the ring's two labels and the controller
//     ownerReference are all it keeps) and the labels of Namespaces.
//   - Every object of a main resource in a selected namespace is labelled
//     with the instance the ring's algorithm picks among the ready
//     instances. New objects are handled from their watch event, within
//     milliseconds. Nothing is assigned while a ring has no ready instance,
//     and never to an instance that is not ready.
//   - A controlled object (one whose controller ownerReference chain leads to
//     a main object of the ring) carries its main object's instance. When the
//     main object moves, its controlled objects are relabelled first.
//   - Membership changes are answered from the caches, without listing
//     anything from the API server: only objects whose instance changed move.
//     An object on a ready instance is drained (see package drain) and moved
//     once the instance acknowledges, or when the ring's drainTimeout passes.
//     An object on a dead instance, or on an instance without a Lease, is
//     relabelled at once. Objects on expired or uncertain instances stay
//     where they are until the instance is ready again or dead.
//   - Writes are JSON merge patches of the two labels only; patches of main
//     objects carry the cached resourceVersion, so a decision taken on a
//     stale cache fails with a conflict and is taken again. Failed writes are
//     retried with exponential backoff.
//   - A restarted or newly elected sharder converges from the labels it finds:
//     objects already on their instance are not touched, and a drain in
//     flight keeps its drainTimeout, counted from the start the drain
//     request wrote on the object (v1alpha1.DrainStartedAnnotation; a
//     drain without one gets a fresh timeout).
//   - Every ring carries the finalizer v1alpha1.FinalizerLabels: a deleted
//     ring stops being assigned at once, and goes once the controller has
//     removed its shard and drain labels from every object of its
//     resources, so that no object is left drained or released with no
//     ring to finish the move.
//   - The ring's status (Ready condition, instance and object counts, drains
//     in flight) is written only when it changed, at most once per
//     Options.StatusInterval. Nothing runs while nothing changes, apart from
//     the resync every Options.ResyncPeriod and the lookup of the ring's
//     resources every Options.ResolveInterval (from the discovery the
//     sharder cached, asked again of the API server only while a resource
//     of the ring is not served: a CustomResourceDefinition installed
//     later, or recreated serving another version, is picked up then).
//
// A ring naming a resource that the API server does not serve, or that the
// sharder may not list, watch or patch, is reported as Ready=False with
// reason ResourceNotServed or ResourceForbidden, and so is one that stops
// being served or permitted after the ring started (with an event); the
// ring's other resources and other rings keep working, and the ring is
// Ready again on its own once the resource can be listed and watched. The
// sharder needs get, list, watch and patch on every resource of every ring:
// the ring's owner grants it (see docs/assignment.md).
//
// A ring of unit Slots (docs/design.md §11) is served differently: the
// controller runs the ring's slot labeler (package slotlabel), which writes
// each object's slot label once, and writes the ring's status (Ready,
// members with their states, weights and granted slots, the objects still
// without a slot label) with a merge patch that never carries
// status.slots, the slot table, which is the slot table controller's
// (package slottable); it is not locked on the ring's resourceVersion, so
// that it does not conflict with the table writes. No object of such a ring
// gets a shard or drain label, and moving slots writes no object. The
// labeler is restarted when the ring's resources, namespaces or
// namespaceSelector change. Deleting the ring removes the slot label from
// every object carrying it (listed by label from the API server, page by
// page), then the finalizer.
package assign
