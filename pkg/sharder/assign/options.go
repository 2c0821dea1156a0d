package assign

import (
	"errors"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"

	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/sharder/config"
	"github.com/sharder-dev/sharder/pkg/sharder/leasecontroller"
	"github.com/sharder-dev/sharder/pkg/sharder/metrics"
	"github.com/sharder-dev/sharder/pkg/sharder/ringbuilds"
)

// Defaults of Options.
const (
	DefaultStatusInterval  = time.Second
	DefaultResolveInterval = 30 * time.Second
)

// Options configures the assignment controller.
type Options struct {
	// Registry holds the membership of every ring, as the lease controller
	// publishes it. Required.
	Registry *leasecontroller.Registry

	// Workers is the number of objects of one ring processed (and written)
	// concurrently. Each ring has its own workers. Default: 16.
	Workers int

	// ResyncPeriod is how often every object of a ring is checked again
	// from the caches, to heal anything a missed event left behind.
	// Default: 5m.
	ResyncPeriod *time.Duration

	// StatusInterval is the least time between two status writes of one
	// ring. Default: 1s.
	StatusInterval *time.Duration

	// ResolveInterval is how often the resources of a ring are looked up
	// again: a resource the API server does not serve may be installed
	// later, or its CustomResourceDefinition recreated serving another
	// version, which the ring then watches. Only a ring with a resource not
	// served asks the API server's discovery again. Default: 30s.
	ResolveInterval *time.Duration

	// RESTConfig is used to watch and patch the rings' resources. It is
	// copied, and its QPS and Burst are replaced by the fields below.
	// Default: the manager's config.
	RESTConfig *rest.Config

	// QPS and Burst limit the client that watches and patches the rings'
	// resources. client-go's defaults (5 and 10) would hold assignment back
	// to a few objects per second; the number of Workers bounds the
	// requests in flight instead. A negative QPS turns client-side rate
	// limiting off. The API server's priority and fairness settings still
	// apply. Default: 5000 and 10000.
	QPS   float32
	Burst int

	// FieldManager names the sharder in its label and status writes.
	// `sharder run` sets it to webhook.LeaderFieldManager of the replica's
	// leader-election identity: the validating webhook allows the sharder's
	// label writes only with the field manager of the replica that leads.
	// Default: "" (the API server derives a manager from the user agent).
	FieldManager string

	// WriteTimeout is the deadline of each label write, which the API
	// server enforces: a write not done by then (one whose admission waits
	// for a webhook replica that does not answer, frozen by SIGSTOP or a
	// long garbage collection) fails instead of landing later. It must be
	// shorter than the validating webhook's timeout: under failure policy
	// Ignore, a write that outlived the webhook call would land unchecked,
	// seconds after it was decided. A write that fails is retried.
	// It must be the lease controller's WriteTimeout.
	// Default: membership.DefaultWriteTimeout (2s; the webhook's default
	// timeout is 5s).
	WriteTimeout time.Duration

	// NamespacedWatchLimit is the most namespaces a ring's namespaced
	// resources are watched in one by one. A ring whose namespaceSelector
	// names its namespaces (kubernetes.io/metadata.name with = or in) and
	// names at most this many has its resources listed and watched in
	// those namespaces alone: objects elsewhere cost the sharder no memory
	// and it needs no permission outside them. Other rings are watched
	// across the cluster. A negative value watches every ring across the
	// cluster. Default: 8.
	NamespacedWatchLimit int

	// Rings keeps the rings built from the memberships. `sharder run` shares
	// one with the webhook, so that each membership of a ring is built once
	// in the process and the next ring is derived from it. Default: the
	// controller's own, counting its builds in sharder_ring_rebuilds_total.
	Rings *ringbuilds.Builds

	// Clock is used for drain timeouts, latencies and periodic work.
	// Default: the real clock.
	Clock clock.WithTicker

	// EventRecorder records the events on the rings. It should write core/v1
	// Events (client-go tools/record), which keep every distinct message, as
	// pkg/sharder/eventrecorder's do. Required.
	EventRecorder record.EventRecorder
}

// setDefaults fills unset fields and checks the rest.
func (o *Options) setDefaults() error {
	if o.Registry == nil {
		return errors.New("no Registry: set Options.Registry to the lease controller's registry")
	}
	if o.EventRecorder == nil {
		return errors.New("no EventRecorder: set Options.EventRecorder (eventrecorder.New makes one that writes core/v1 Events)")
	}
	if o.Workers <= 0 {
		o.Workers = config.DefaultAssignmentWorkers
	}
	if o.ResyncPeriod == nil || *o.ResyncPeriod <= 0 {
		d := config.DefaultResyncPeriod
		o.ResyncPeriod = &d
	}
	if o.NamespacedWatchLimit == 0 {
		o.NamespacedWatchLimit = config.DefaultNamespacedWatchLimit
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = membership.DefaultWriteTimeout
	}
	if o.StatusInterval == nil || *o.StatusInterval <= 0 {
		d := DefaultStatusInterval
		o.StatusInterval = &d
	}
	if o.ResolveInterval == nil || *o.ResolveInterval <= 0 {
		d := DefaultResolveInterval
		o.ResolveInterval = &d
	}
	if o.QPS == 0 {
		o.QPS = config.DefaultQPS
	}
	if o.Burst <= 0 {
		o.Burst = config.DefaultBurst
	}
	if o.Rings == nil {
		o.Rings = &ringbuilds.Builds{Built: metrics.CountRingRebuild}
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	return nil
}
