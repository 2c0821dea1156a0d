// Command local-control-plane runs etcd and kube-apiserver (built from Go
// modules by `make control-plane`) as long-running processes and writes an
// admin kubeconfig, for the demo, the e2e suite and trying things by hand.
//
//	go run ./hack/local-control-plane --kubeconfig bin/demo/kubeconfig --crds config/crd
//
// It stops the control plane and removes its data on SIGINT or SIGTERM.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/sharder-dev/sharder/internal/testenv"
)

func main() {
	// A flag set of its own: imported packages register --kubeconfig on the
	// global one.
	fs := flag.NewFlagSet("local-control-plane", flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "bin/local/kubeconfig", "where to write the admin kubeconfig")
	crds := fs.String("crds", "", "comma-separated folders of CRD manifests to install (relative to the repository root)")
	_ = fs.Parse(os.Args[1:])

	var opts testenv.Options
	if *crds != "" {
		opts.CRDDirectoryPaths = strings.Split(*crds, ",")
	}
	env, err := testenv.Start(opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "local-control-plane: %v\n", err)
		os.Exit(1)
	}
	if err := env.WriteKubeConfig(*kubeconfig); err != nil {
		_ = env.Stop()
		fmt.Fprintf(os.Stderr, "local-control-plane: writing kubeconfig: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("control plane ready: API server %s\n", env.Config.Host)
	fmt.Printf("kubeconfig written to %s; try: kubectl --kubeconfig %s get namespaces\n", *kubeconfig, *kubeconfig)

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	fmt.Println("stopping control plane")
	if err := env.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "local-control-plane: stopping: %v\n", err)
		os.Exit(1)
	}
}
