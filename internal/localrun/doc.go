// Package localrun runs the sharder as users run it, for the end-to-end
// suite, the demo and the benchmarks: a local control plane (real etcd and
// kube-apiserver), the sharder and instance binaries built from this
// repository and started as processes, users with their own identities, and
// helpers to observe assignments, Leases and reconcile logs.
//
// Most callers need:
//
//	cp, err := localrun.StartControlPlane(localrun.ControlPlaneOptions{Dir: dir, CRDs: localrun.DefaultCRDs()})
//	bins, err := localrun.Build(localrun.BuildOptions{Dir: dir})
//	p, err := localrun.StartProcess(localrun.ProcessOptions{Name: "sharder-0", Path: bins.Sharder, Args: ...})
//
// Every process writes its output into a log file under the run's folder;
// Processes.DumpLogs prints them when a test fails. Processes are killed when
// the process that started them exits, so nothing outlives a run. A process
// started with a RestartPolicy is started again, with backoff, whenever it
// exits on its own, as the kubelet restarts a container: Stop and Kill end
// it for good, while a run ended by Signal is restarted.
package localrun
