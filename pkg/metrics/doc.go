// Package metrics defines the sharder's Prometheus metrics. Every metric is
// registered on controller-runtime's metrics.Registry (served by the
// manager's metrics endpoint) and named with the sharder_ prefix.
//
// metrics.go holds the assignment metrics: instances, objects per instance,
// assignments, moves, drains, assignment latency and ring rebuilds;
// leases.go the lease controller's (state transitions, takeovers, deleted
// Leases); webhook.go the webhook's (decisions and their duration).
// docs/operations.md lists them all.
package metrics
