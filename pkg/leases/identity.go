package leases

import "github.com/sharder-dev/sharder/pkg/instance/lease"

// DefaultIdentity returns the ID of this process as instances choose theirs
// (lease.DefaultIdentity): the POD_NAME environment variable, else the
// hostname. The lease controller builds the sharder's own holder identity
// from it.
func DefaultIdentity() (string, error) { return lease.DefaultIdentity() }
