package leasecontroller

import "github.com/sharder-dev/sharder/pkg/instance/leaseholder"

// DefaultIdentity returns the ID of this process as instances choose theirs
// (leaseholder.DefaultIdentity): the POD_NAME environment variable, else the
// hostname. The lease controller builds the sharder's own holder identity
// from it.
func DefaultIdentity() (string, error) { return leaseholder.DefaultIdentity() }
