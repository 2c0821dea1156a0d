// Package e2e is the end-to-end suite: it builds the sharder and the example
// etcd operator, starts a local control plane (real etcd and
// kube-apiserver), runs the sharder as two leader-elected replicas with its
// webhook and several operator processes as instances, and drives the
// scenarios users meet: initial assignment, scale-out and scale-in, an
// instance killed, the sharder leader killed, forbidden label edits, a
// churn run checked for overlapping reconciles, and a controller that knows
// nothing of sharder (e2e/plaincontroller) stopped with its `sharder agent`
// sidecar while it reconciles, and a rebalance with the sharder and the
// instances as ordinary ServiceAccounts, their requests classified by the
// chart's FlowSchemas (TestFlowControl), and a ring of unit Slots through
// a scale-out, a killed instance and a killed sharder leader, moving slots
// without writing an object (TestSlotMode).
//
// Instance processes (the operator's, the plain controller and its agent)
// are restarted with backoff when they exit on their own, as the kubelet
// restarts a pod's containers; a scenario that stops or kills an instance
// ends it for good. The sharder replicas are not restarted.
//
// Each scenario is a function taking an input struct, run by a Test
// function; `go test ./e2e/...` (or `make e2e`) runs them all. Process logs
// are printed when a scenario fails.
package e2e
