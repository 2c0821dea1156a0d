package leasecontroller

import (
	"errors"
	"fmt"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/sharder/config"
)

// Options configures the sharder's lease controller. NewController
// fills in the defaults of unset fields and rejects invalid ones.
type Options struct {
	// Registry receives the membership of every ring. Required.
	Registry *Registry

	// Identity is the holder identity the sharder writes into a Lease it
	// takes or holds. It must start with "sharder:": the controller
	// recognises the Leases a sharder (this one or a previous leader) holds
	// by that prefix, and the colon cannot occur in a Lease name, so it never
	// equals an instance ID.
	// Default: "sharder:" + membership.DefaultIdentity().
	Identity string

	// Clock tells the time for the state computations, the takeovers and
	// holds, and the work queues' delays: a Lease requeued at its next
	// transition is reconciled when this clock reaches it.
	// Default: the real clock.
	Clock clock.WithTicker

	// Workers is the number of Leases reconciled concurrently.
	// Default: 4.
	Workers int

	// WriteTimeout is the deadline of the sharder's writes that move work
	// (the assignment's label writes, the slot table's writes): how long
	// one may take to land after it was sent. A dead instance's objects
	// stop being movable that long before the instance could take its
	// Lease back after the sharder's last hold write
	// (membership.Tracker.WriteTimeout). It must be the WriteTimeout of
	// the assignment and of the slot table controller.
	// Default: membership.DefaultWriteTimeout (2s).
	WriteTimeout time.Duration

	// UnknownHold is how long an instance that holds objects (or slots)
	// but whose Lease this sharder never saw (deleted before it led, or
	// written by hand) is held as vanished, from when the sharder first
	// counted its objects, before it is dead and the sharder creates its
	// Lease to hold it while its objects move. Default: 0, twice the
	// longest lease duration among the ring's Leases (twice the default
	// lease duration when it has none), or that duration plus the longest
	// bound on stopping they promise (sharder.dev/max-stop) when that is
	// longer (membership.GoneAfter).
	UnknownHold time.Duration

	// EventRecorder records the events on Leases and rings. It should write
	// core/v1 Events (client-go tools/record), which keep every distinct
	// message. Default: a recorder of its own, component "sharder", stopped
	// with the manager (created by SetupWithManager).
	EventRecorder record.EventRecorder
}

// setDefaults fills in the defaults of unset fields and checks the rest.
// Errors name the field.
func (o *Options) setDefaults() error {
	if o.Registry == nil {
		return errors.New("Options.Registry is required")
	}
	if o.Identity == "" {
		id, err := membership.DefaultIdentity()
		if err != nil {
			return fmt.Errorf("defaulting Options.Identity: %w", err)
		}
		o.Identity = membership.SharderHolderPrefix + id
	}
	if !strings.HasPrefix(o.Identity, membership.SharderHolderPrefix) {
		return fmt.Errorf("Options.Identity %q does not start with %q", o.Identity, membership.SharderHolderPrefix)
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.Workers <= 0 {
		o.Workers = config.DefaultLeaseWorkers
	}
	if o.UnknownHold < 0 {
		return errors.New("Options.UnknownHold is negative")
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = membership.DefaultWriteTimeout
	}
	return nil
}

// CacheByObject returns the cache setting that limits the manager's Lease
// cache to Leases carrying the sharder.dev/ring label. Merge it into the
// manager's cache.Options.ByObject: a cluster holds one Lease per node and
// one per leader election, none of which the sharder needs to see.
func CacheByObject() map[client.Object]cache.ByObject {
	hasRing, err := labels.NewRequirement(v1alpha1.LabelRing, selection.Exists, nil)
	if err != nil {
		// The key is a constant and valid: this cannot happen.
		panic(fmt.Sprintf("building the %s selector: %v", v1alpha1.LabelRing, err))
	}
	return map[client.Object]cache.ByObject{
		&coordinationv1.Lease{}: {Label: labels.NewSelector().Add(*hasRing)},
	}
}
