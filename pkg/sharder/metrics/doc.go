// Package metrics defines the sharder's Prometheus metrics, named with the
// sharder_ prefix. Register adds them to a registry: `sharder run` registers
// them on controller-runtime's metrics.Registry, served by the manager's
// metrics endpoint. Importing the package registers nothing.
//
// metrics.go holds the assignment metrics: ring info, instances, objects
// per instance, assignments, moves, drains, assignment latency and ring
// rebuilds;
// leases.go the lease controller's (state transitions, takeovers, deleted
// Leases); webhook.go the webhook's (decisions and their duration).
// docs/operations.md lists them all.
package metrics
