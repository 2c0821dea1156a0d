// Package drain implements the drain protocol that moves an object from one
// ready instance of a ring to another without two instances working on it at
// the same time, as long as the old instance acknowledges within the ring's
// drainTimeout; after that the sharder forces the move (docs/design.md,
// section 5).
//
// The protocol:
//
//  1. The sharder sets the drain label drain.sharder.dev/<ring>=true on the
//     object, with an optimistic lock on its resourceVersion (RequestPatch).
//  2. The instance named by the shard label shard.sharder.dev/<ring> sees the
//     drain label, lets any in-flight reconcile of the object finish, and
//     removes both labels (Acknowledge). From then on its label-selected
//     cache no longer holds the object.
//  3. The sharder sees the object unassigned and labels it with its new
//     instance.
//
// If the instance does not acknowledge within the ring's drainTimeout, the
// sharder forces the move. Tracker keeps the start of each drain in memory;
// a sharder that starts and finds a drain label it did not set gives that
// drain a fresh timeout, so a restart never shortens a drain.
//
// The sharder side is RequestPatch, Requested and Tracker; the instance side
// is Acknowledge.
package drain
