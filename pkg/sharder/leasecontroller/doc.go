// Package leasecontroller runs ring membership on per-instance Leases on the
// sharder's side. The states, their timings and the ring built from a
// membership live in package membership, which does no I/O; the holder an
// instance runs to keep its own Lease lives in package
// github.com/sharder-dev/sharder/pkg/instance/leaseholder.
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
package leasecontroller
