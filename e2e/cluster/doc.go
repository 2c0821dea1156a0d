// Package cluster is the end-to-end suite that runs on a real one-node
// cluster (make cluster): pods, Services, the garbage collector and the Helm
// chart, none of which a bare API server has. TestMain starts the cluster
// with make cluster, as root, and stops it with make cluster-down; it fails
// with the reason when the cluster cannot start, never skips.
//
// The scenarios install charts/sharder with its default values and check
// what users see: two Ready replicas and one leader, the webhook answering
// through its Service with its self-managed certificate, membership in
// Leases and ControllerRings, Leases garbage collected with their pods, a
// controller that knows nothing of sharder beyond a label selector with
// `sharder agent` as a native sidecar (a rolling update that moves nothing,
// without overlapping reconciles), the example operator as a StatefulSet
// scaled from 3 to 4 pods (moves through drains, a rolling update that moves
// none of 32 EtcdClusters and leaves none without an instance for longer
// than its pod's restart and 2 s, no overlapping reconciles), and an
// uninstall that leaves nothing behind that would reject writes.
package cluster
