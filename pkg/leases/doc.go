// Package leases runs ring membership on per-instance Leases: the sharder's
// lease controller and the lease holder an instance runs. The states, their
// timings and the ring built from a membership live in package membership,
// which does no I/O.
//
// Each instance of a ring holds a Lease named after its instance ID in the
// ring's spec.leaseNamespace, labelled sharder.dev/ring=<ring>.
//
//   - Controller (NewController, SetupWithManager) is the sharder's
//     leader-only lease controller: it labels Leases with their state, takes
//     uncertain Leases, deletes orphaned ones and publishes each ring's
//     members into a Registry. Build the manager's cache with CacheByObject.
//   - Registry holds the published memberships; the assignment engine
//     subscribes to it.
//   - Holder (NewHolder) is the Runnable an instance runs to create, renew
//     and release its own Lease; `sharder agent` runs it as a sidecar.
package leases
