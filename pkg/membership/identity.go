package membership

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// DefaultIdentity returns the instance ID of this process: the POD_NAME
// environment variable (set it from the downward API), else the hostname.
// Both stay the same across restarts of a StatefulSet's pod; a Deployment's
// pod gets a new one with every start. It does not check the ID (InvalidID):
// a hostname may be longer than a label value allows.
//
// The instance library and `sharder agent` default their instance ID to it;
// the sharder's lease controller builds its own holder identity from it.
func DefaultIdentity() (string, error) {
	if name := os.Getenv("POD_NAME"); name != "" {
		return name, nil
	}
	name, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("POD_NAME is not set, and the hostname is unknown: %w", err)
	}
	return name, nil
}

// InvalidID returns why id cannot be an instance ID, nil when it can. An
// instance ID names a Lease and is the value of the shard label, so it must
// be both a DNS subdomain and a label value: at most 63 characters of
// lower-case letters, digits, '-' and '.', starting and ending with a letter
// or digit.
func InvalidID(id string) error {
	var errs []string
	errs = append(errs, validation.IsDNS1123Subdomain(id)...)
	errs = append(errs, validation.IsValidLabelValue(id)...)
	if id == "" {
		errs = append(errs, "must not be empty")
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("instance ID %q names a Lease and is a label value: %s", id, strings.Join(slices.Compact(errs), "; "))
}
