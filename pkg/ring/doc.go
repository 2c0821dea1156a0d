// Package ring decides which instance owns which object.
//
// A Ring is built by an Algorithm from a membership (instance IDs with
// weights) and answers Lookup(key) with an instance ID. Most callers need:
//
//   - New(algorithm, members): build a ring with a built-in or registered
//     algorithm (ConsistentHash by default; ConsistentHashDense for large
//     rings; Rendezvous, HashMod, Range).
//   - ObjectKey: the hash key of a main object.
//   - Resolver: the hash key of any object of a ring's resources, following
//     controller ownerReferences from controlled objects to their main object.
//
// Rings are immutable once built and safe for concurrent use; the same set of
// members gives the same ring on every replica, whatever the order. Build
// one per membership change, never per object. Register plugs in other
// algorithms. docs/ring.md compares the algorithms with measured figures.
package ring
