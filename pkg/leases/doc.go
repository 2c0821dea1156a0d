// Package leases implements ring membership on per-instance Leases: the
// lease states and their timings, the sharder's lease controller, and the
// lease holder an instance runs.
package leases
