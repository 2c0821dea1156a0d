// Command cluster starts and stops a real one-node Kubernetes cluster on this
// machine, for the end-to-end tests that need real pods (make cluster, make
// cluster-down, e2e/cluster):
//
//	go run ./hack/cluster up --dir bin/cluster --control-plane DIR --node DIR --images bin/images
//	go run ./hack/cluster down --dir bin/cluster
//
// up runs etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
// containerd, the kubelet, kube-proxy and a cluster DNS server (cluster dns,
// a copy of this command answering for Services and StatefulSet pods) as root, in the background, on
// uncommon ports; imports the image tarballs into containerd; waits for the
// node to be Ready; and writes an admin kubeconfig to DIR/kubeconfig. It
// installs runc, the CNI plugins, iptables and conntrack from Debian's
// packages when they are missing. A cluster left by an earlier run (even one
// that was killed) is torn down first.
//
// down stops every process of the cluster by PID and undoes what the cluster
// changed on the host: sysctls, iptables chains, the bridge, cgroups, mounts,
// log symlinks. It works from what it finds on the host, so it also cleans up
// after a run that was killed. It keeps DIR/logs.
//
// Everything the cluster writes lives under DIR, except what the kubelet and
// containerd cannot be told to put elsewhere (/var/log/containers symlinks,
// shim sockets under /run/containerd, CNI results under /var/lib/cni);
// down removes those too.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 || (os.Args[1] != "up" && os.Args[1] != "down" && os.Args[1] != "dns") {
		fmt.Fprintln(os.Stderr, "usage: cluster up|down|dns --dir DIR [flags]")
		os.Exit(2)
	}
	// A flag set of its own: imported packages register flags on the global one.
	fs := flag.NewFlagSet("cluster "+os.Args[1], flag.ExitOnError)
	dir := fs.String("dir", "bin/cluster", "the cluster's state folder; the kubeconfig is written to DIR/kubeconfig")
	controlPlane := fs.String("control-plane", "", "folder holding etcd, kube-apiserver and kubectl (up)")
	node := fs.String("node", "", "folder holding kubelet, kube-controller-manager, kube-scheduler, kube-proxy, containerd, containerd-shim-runc-v2 and ctr (up)")
	images := fs.String("images", "", "folder of image tarballs (*.tar) to import into containerd (up)")
	pauseImage := fs.String("pause-image", "", "reference of the sandbox image, one of the imported images (up)")
	timeout := fs.Duration("timeout", 3*time.Minute, "how long up waits for the node to be Ready")
	listen := fs.String("listen", "", "address the DNS server answers on (dns; up starts it)")
	_ = fs.Parse(os.Args[2:])

	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	if os.Args[1] == "dns" {
		l, err := newLayout(*dir)
		if err == nil {
			err = serveDNS(ctx, l, *listen)
		}
		cancel()
		if err != nil {
			fmt.Fprintf(os.Stderr, "cluster dns: %v\n", err)
			os.Exit(1)
		}
		return
	}
	err := run(ctx, os.Args[1], *dir, *controlPlane, *node, *images, *pauseImage, *timeout)
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "cluster %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cmd, dir, controlPlane, node, images, pauseImage string, timeout time.Duration) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("the local cluster runs its node as root: run as root (sudo make cluster)")
	}
	l, err := newLayout(dir)
	if err != nil {
		return err
	}
	if cmd == "down" {
		return down(ctx, l)
	}
	for _, p := range []*string{&controlPlane, &node, &images} {
		if *p == "" || pauseImage == "" {
			return fmt.Errorf("--control-plane, --node, --images and --pause-image are required")
		}
		if *p, err = filepath.Abs(*p); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	if err := up(ctx, l, controlPlane, node, images, pauseImage); err != nil {
		return fmt.Errorf("%w (logs in %s; make cluster-down cleans up)", err, l.path("logs"))
	}
	fmt.Printf("cluster ready in %s: kubectl --kubeconfig %s get nodes\n", time.Since(start).Round(100*time.Millisecond), l.kubeconfig())
	return nil
}
