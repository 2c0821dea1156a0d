// Package drain implements the drain protocol that moves an object from one
// ready instance of a ring to another without two instances working on it at
// the same time, as long as the old instance acknowledges within the ring's
// drainTimeout; after that the sharder forces the move
// (docs/design.md §5).
//
// The protocol:
//
//  1. The sharder sets the drain label drain.sharder.dev/<ring> on the
//     object, its value the ID of the instance the object moves to, with an
//     optimistic lock on its resourceVersion (RequestPatch).
//  2. The instance named by the shard label shard.sharder.dev/<ring> sees the
//     drain label, lets any in-flight reconcile of the object finish, and
//     hands the object over (Acknowledge): one patch, locked on the
//     resourceVersion too, sets the shard label to the drain's target
//     (Target) and removes the drain label. From then on its label-selected
//     cache no longer holds the object, and the new instance's does.
//
// A move thus costs two writes and needs nothing from the sharder between
// them. While the drain waits, the sharder rewrites its value when the
// object's target changes; it checks the result of the acknowledgement like
// any other object's and moves the object on if the target is no longer
// right by then. An acknowledgement conflicts with a rewrite (both are
// locked on the resourceVersion): read the object again and acknowledge
// what it says now. A drain label of
// NoTarget ("true", what sharders before the hand-over wrote, and what the
// sharder writes for an object with controlled objects, which must move
// before their owner) or of any value that is not an instance ID names no
// target: Acknowledge then removes both labels, and the sharder assigns
// the object to its new instance. An acknowledgement that removes both
// labels is accepted whatever the drain names.
//
// If the instance does not acknowledge within the ring's drainTimeout, the
// sharder forces the move. The sharder keeps the start of each drain in
// memory; a sharder that starts and finds a drain label it did not set gives that
// drain a fresh timeout, so a restart never shortens a drain.
//
// The sharder side is RequestPatch and Requested; the instance side is
// Requested, Target and Acknowledge.
package drain
