// Package ring decides which instance owns which object.
//
// A Ring is built by an Algorithm from a membership (instance IDs with
// weights) and answers Lookup(key) with an instance ID. Most callers need:
//
//   - New(algorithm, members): build a ring with a built-in or registered
//     algorithm (ConsistentHash by default; ConsistentHashDense for large
//     rings; Rendezvous, HashMod, Range).
//   - ObjectKey: the hash key of a main object; LookupObject looks one up
//     from its parts without building the key.
//
// A controlled object is assigned with the main object at the top of its
// chain of controller ownerReferences; following those chains is the
// sharder's (pkg/sharder/assign), not this package's.
//
// Rings are immutable once built and safe for concurrent use; the same set of
// members gives the same ring on every replica, whatever the order. Build
// one per membership change, never per object. Register plugs in other
// algorithms. docs/ring.md compares the algorithms with measured figures.
package ring
