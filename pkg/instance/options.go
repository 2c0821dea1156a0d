package instance

import (
	"errors"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/clock"

	"github.com/sharder-dev/sharder/pkg/instance/leaseholder"
)

// Options configures an instance. Ring and LeaseNamespace are required.
type Options struct {
	// Ring is the name of the ControllerRing whose objects this instance
	// reconciles. Required.
	Ring string

	// LeaseNamespace is the ring's spec.leaseNamespace: the instance's Lease
	// is created there. Required.
	LeaseNamespace string

	// Identity is the instance ID: the name of its Lease and the value of the
	// shard label on its objects. It must be the identity given to
	// CacheByObject, and stable across restarts of the same instance (a new
	// identity moves every object).
	// Default: DefaultIdentity() (the POD_NAME variable, else the hostname).
	Identity string

	// VirtualNodes is the instance's weight in the ring, written to its
	// Lease's sharder.dev/virtual-nodes label.
	// Default: 0, no label: the ring's spec.virtualNodes.
	VirtualNodes int

	// LeaseDuration is the Lease's duration: the sharder moves this instance's
	// objects away when it has not renewed the Lease for about twice as long.
	// Default: 15s.
	LeaseDuration time.Duration

	// RenewPeriod is how often the Lease is renewed; it must be shorter than
	// RenewDeadline.
	// Default: LeaseDuration/3 (5s for the default duration).
	RenewPeriod time.Duration

	// RenewDeadline is how long after its last successful renewal the
	// instance gives up the Lease (stops reconciling, OnLost); it must be
	// shorter than LeaseDuration, so that the instance has stopped before a
	// successor with the same identity could acquire the Lease.
	// Default: LeaseDuration*2/3 (10s for the default duration).
	RenewDeadline time.Duration

	// Pod, when set, becomes the Lease's owner, so that garbage collection
	// removes the Lease with the instance's Pod.
	// Default: none.
	Pod *metav1.OwnerReference

	// OnLost is called once the instance has lost its Lease (it could not
	// renew it within RenewDeadline, another party took it, or it was
	// deleted or left the ring). By then the instance has stopped admitting
	// reconciles for good and cancelled those in flight (cause ErrLeaseLost);
	// the Lease holder then stops, and with it the manager: mgr.Start returns
	// an error wrapping ErrLeaseLost, and the usual answer is to exit
	// non-zero and let the process restart, as after lost leader election.
	// OnLost is for callers who want to react before that (a metric, an
	// alert).
	// Default: none.
	OnLost func()

	// Release is how the instance hands its Lease back on a graceful stop,
	// once its reconciles in flight have finished: leaseholder.ReleaseRestart when
	// the instance comes back with the same ID (a StatefulSet's pod), so
	// that the sharder keeps its objects for the ring's restartHold and a
	// rolling update moves no object; leaseholder.ReleaseStop when it does not (a
	// Deployment's pod), so that its objects move at once.
	// Default: leaseholder.ReleaseStop.
	Release leaseholder.Release

	// ShutdownTimeout bounds how long shutdown waits for reconciles in flight
	// before the Lease is released anyway.
	// Default: 30s.
	ShutdownTimeout time.Duration

	// RetryPeriod is how soon a request that arrives before the instance holds
	// its Lease is tried again.
	// Default: 1s.
	RetryPeriod time.Duration

	// Clock is used for the Lease's timing.
	// Default: the real clock.
	Clock clock.Clock
}

// Defaults of Options. The Lease's timings and the shutdown timeout are the
// lease holder's: leaseholder.DefaultLeaseDuration and leaseholder.DefaultShutdownTimeout.
const (
	DefaultRetryPeriod = time.Second
)

// DefaultIdentity returns the default instance ID: the POD_NAME environment
// variable, else the hostname.
func DefaultIdentity() (string, error) {
	return leaseholder.DefaultIdentity()
}

// setDefaults fills in defaults and checks the options. Durations the lease
// holder owns (LeaseDuration, RenewPeriod, RenewDeadline) are defaulted and
// checked by it.
func (o *Options) setDefaults() error {
	var errs []error
	if msgs := validation.IsDNS1123Label(o.Ring); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("ring %q is not a valid ring name: %v", o.Ring, msgs))
	}
	if msgs := validation.IsDNS1123Label(o.LeaseNamespace); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("lease namespace %q is not a valid namespace name: %v", o.LeaseNamespace, msgs))
	}
	if o.Identity == "" {
		id, err := DefaultIdentity()
		if err != nil {
			errs = append(errs, fmt.Errorf("finding the default instance identity: %w", err))
		}
		o.Identity = id
	}
	if o.Identity != "" {
		if err := leaseholder.ValidateIdentity(o.Identity); err != nil {
			errs = append(errs, err)
		}
	}
	if o.VirtualNodes < 0 {
		errs = append(errs, fmt.Errorf("virtual nodes must not be negative, got %d", o.VirtualNodes))
	}
	if o.ShutdownTimeout < 0 {
		errs = append(errs, fmt.Errorf("shutdown timeout must not be negative, got %s", o.ShutdownTimeout))
	}
	if o.RetryPeriod < 0 {
		errs = append(errs, fmt.Errorf("retry period must not be negative, got %s", o.RetryPeriod))
	}
	if o.RetryPeriod == 0 {
		o.RetryPeriod = DefaultRetryPeriod
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	return errors.Join(errs...)
}
