// Package metacache keeps the metadata the assignment controller reads of a
// ring's objects: one metadata-only informer per resource, whose transform
// reduces every object to an Object (name, namespace, uid,
// resourceVersion, the ring's shard and drain labels, the controller
// ownerReference, the deletion timestamp) and shares equal values between
// the objects of a ring, so that each cached object costs the sharder a few
// hundred bytes of heap (docs/benchmarks-objects.md measures it). A Cache
// may watch only the objects a label selector selects (the slot labeler's
// objects without a slot label).
//
// A ring builds one ObjectTransform, a Cache per main and controlled
// resource with NewObjects (controlled ones indexed by controller) and a
// Namespace cache with NewNamespaces, then runs them. Each Cache also
// records what keeps the sharder from using its resource (Problem), for the
// ring's Ready condition.
package metacache
