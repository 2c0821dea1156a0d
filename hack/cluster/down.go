package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"syscall"
	"time"
)

// down stops the cluster and undoes its changes to the host. It relies on
// what it finds (processes, cgroups, mounts, chains), not on what up
// recorded, so it also cleans up after a run that was killed; only the
// sysctls and the folders up found missing come from DIR/host.json. Running
// it twice is harmless.
func down(ctx context.Context, l layout) error {
	var errs []error
	byName := func(names ...string) []int {
		var pids []int
		for _, p := range findProcesses(l) {
			if slices.Contains(names, p.name) {
				pids = append(pids, p.pid)
			}
		}
		return pids
	}
	// The node first, so that nothing restarts the containers; then the
	// containers (every process in the kubelet's cgroups); then the rest.
	stop(byName("kubelet", "kube-proxy", dnsBinary))
	for i := 0; i < 50; i++ {
		pids := cgroupProcesses()
		if len(pids) == 0 {
			break
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The API server's clients before it, and etcd last: each stops at once
	// instead of waiting for the connections of the others.
	stop(byName("containerd-shim-runc-v2", "ctr", "containerd", "kube-scheduler", "kube-controller-manager"))
	stop(byName("kube-apiserver"))
	stop(byName(components...))
	if left := findProcesses(l); len(left) > 0 {
		errs = append(errs, fmt.Errorf("processes still running: %v", left))
	}

	if err := unmountAll(l.dir); err != nil {
		errs = append(errs, err)
	}
	if err := removeBridge(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := cleanIptables(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := removeCgroups(); err != nil {
		errs = append(errs, err)
	}
	state, err := loadHost(l)
	if err != nil {
		errs = append(errs, fmt.Errorf("reading %s: %w", l.path("host.json"), err))
	}
	if err := removeNFTables(ctx, state); err != nil {
		errs = append(errs, err)
	}
	if err := cleanHostPaths(l, state); err != nil {
		errs = append(errs, err)
	}
	if err := restoreSysctls(state); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		// Keep host.json and the state: a second down may finish the job.
		return errors.Join(errs...)
	}
	// The state goes (nothing is mounted under it any more); the logs stay
	// for whoever wants to know what happened.
	entries, _ := os.ReadDir(l.dir)
	for _, e := range entries {
		if e.Name() == "logs" {
			continue
		}
		if err := os.RemoveAll(l.path(e.Name())); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
