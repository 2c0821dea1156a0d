// Package membership is the single home of ring membership, with no I/O:
// the state of an instance (docs/design.md §3), the member (ID, weight,
// state), whether a member may receive objects or is gone, and the ring
// built from a ring's members.
//
// Most callers need:
//
//   - StateOf, VirtualNodesOf and MemberOf: an instance's state, its next
//     transition and its weight from its Lease and a time. Malformed Leases
//     get a documented state, never an error.
//   - State.Ready and State.Gone: whether the instance is on the ring, and
//     whether its objects move at once without a drain.
//   - Tracker: states as one observer sees Leases over time, on its own
//     clock; Tracker.Ready answers for one instance in constant time.
//   - Rings.Build: the ring over a membership's ready instances, built once
//     per membership, with a lock per ring. The sharder's assignment and its
//     webhook both build their rings here, so they agree once they have
//     seen the same membership.
package membership
