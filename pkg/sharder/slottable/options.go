package slottable

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"

	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/sharder/leasecontroller"
)

// Defaults of Options.
const (
	DefaultWorkers = 4
)

// Options configures the slot table controller. NewController fills in the
// defaults of unset fields and rejects invalid ones.
type Options struct {
	// Registry is the lease controller's registry: the controller reads the
	// rings' members from it, is woken by its changes, and records in it how
	// many slots each instance holds. Required.
	Registry *leasecontroller.Registry

	// Identity is the holder identity the sharder writes into a Lease it
	// takes to fence an instance: the lease controller's identity, so that
	// it holds the fenced Lease as its own takeover.
	// Default: "sharder:" + membership.DefaultIdentity(), as the lease
	// controller's.
	Identity string

	// Clock tells the time of the decisions (slots.Input.Now), of the
	// releases seen, and of the work queue's delays. Default: the real clock.
	Clock clock.WithTicker

	// Workers is the number of rings decided concurrently. Default: 4.
	Workers int

	// WriteTimeout is the deadline of each table write, which the API
	// server enforces: a write granting a dead instance's slots lands
	// within it or not at all, before the lease controller may release the
	// instance's Lease. It must not exceed the lease controller's
	// WriteTimeout. Default: membership.DefaultWriteTimeout (2s).
	WriteTimeout time.Duration

	// FieldManager is the field manager of the table writes; empty: the
	// client's default.
	FieldManager string

	// SkipBinding turns off writing the rings' bindings of the slot label
	// policy (slotpolicy.Binding).
	SkipBinding bool

	// EventRecorder records the events on rings. Default: a core/v1
	// recorder of its own, component "sharder" (created by
	// SetupWithManager).
	EventRecorder record.EventRecorder
}

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
		o.Workers = DefaultWorkers
	}
	if o.WriteTimeout < 0 {
		return errors.New("Options.WriteTimeout is negative")
	}
	if o.WriteTimeout == 0 {
		o.WriteTimeout = membership.DefaultWriteTimeout
	}
	return nil
}
