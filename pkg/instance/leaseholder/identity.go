package leaseholder

import (
	"fmt"

	"github.com/sharder-dev/sharder/pkg/membership"
)

// ValidateIdentity checks that id can be an instance ID: the name of a Lease
// (a DNS subdomain) and the value of the shard label on the instance's
// objects (at most 63 characters). An ID that is only a valid Lease name
// would let the instance join the ring while every label write naming it
// fails, leaving its objects unassigned.
func ValidateIdentity(id string) error {
	if err := membership.InvalidID(id); err != nil {
		return fmt.Errorf("%w; choose an ID of at most 63 lowercase letters, digits, '-' and '.', starting and ending with a letter or digit "+
			"(set it explicitly, or set POD_NAME from the downward API, rather than rely on the hostname)", err)
	}
	return nil
}
