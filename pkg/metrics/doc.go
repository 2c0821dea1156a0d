// Package metrics defines the sharder's Prometheus metrics. Every metric is
// registered on controller-runtime's metrics.Registry (served by the
// manager's metrics endpoint) and named with the sharder_ prefix.
//
// metrics.go holds the assignment metrics: instances, objects per instance,
// assignments, moves, drains, assignment latency and ring rebuilds. Other
// parts of the sharder add their metrics in their own files here.
package metrics
