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
//   - Holding (the instance's holder) and Take, Fence, Hold, Release,
//     NewHeld, HoldInRing and WithState (the sharder): every version of an
//     instance Lease either side writes, built in one place (record.go), so
//     that the protocol's rules on acquireTime, leaseTransitions, the
//     takeover's duration and the Lease's labels and annotations are
//     written once. RecordOf reads the holder record back.
//   - Rings.Build: the ring over a membership's ready instances, built once
//     per membership, with a lock per ring. The sharder's assignment and its
//     webhook both build their rings here, so they agree once they have
//     seen the same membership.
package membership
