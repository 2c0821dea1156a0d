package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
)

// Addresses and names of the cluster. The ports are uncommon so that the
// cluster runs next to envtest's control planes and the demo.
const (
	nodeName       = "sharder-node"
	etcdPort       = 16379
	etcdPeerPort   = 16380
	apiServerPort  = 16443
	kcmPort        = 16257
	schedulerPort  = 16259
	kubeletPort    = 16250
	kubeletHealthz = 16248
	proxyHealthz   = 16256
	proxyMetrics   = 16249
	// registryHost is the local registry's address: containerd pulls from
	// it over plain HTTP (registryHostsConfig).
	registryHost    = "127.0.0.1:16500"
	serviceCIDR     = "10.97.0.0/16"
	kubernetesSvcIP = "10.97.0.1"
	podCIDR         = "10.98.0.0/24"
	bridgeName      = "sharder0"
	cniNetwork      = "sharder-cluster"
	// cgroupRoot is the kubelet's own cgroup in every hierarchy.
	cgroupRoot = "sharder-cluster"
)

// components are the names of the cluster's processes. down stops only
// processes with one of these names whose command line mentions the state
// folder, so that it never touches another control plane built from the
// same binaries.
var components = []string{
	"kubelet", "kube-proxy", dnsBinary, "containerd-shim-runc-v2", "ctr", "containerd",
	"kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd",
}

// layout is the state folder.
type layout struct {
	dir string
}

func newLayout(dir string) (layout, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return layout{}, err
	}
	if err := os.MkdirAll(abs, 0o750); err != nil {
		return layout{}, err
	}
	// Mount points and command lines carry the resolved path.
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return layout{}, err
	}
	l := layout{dir: real}
	// A unix socket path has at most 107 bytes.
	if n := len(l.socket()); n > 100 {
		return layout{}, fmt.Errorf("state folder %s is too deep for containerd's socket (%d bytes); use a shorter --dir", real, n)
	}
	return l, nil
}

func (l layout) path(elem ...string) string {
	return filepath.Join(append([]string{l.dir}, elem...)...)
}

func (l layout) kubeconfig() string { return l.path("kubeconfig") }
func (l layout) socket() string     { return l.path("run", "containerd.sock") }
func (l layout) pki(name string) string {
	return l.path("pki", name)
}

// hostIP returns the address other hosts and the pods reach this machine
// at: the source address of the default route.
func hostIP(ctx context.Context) (net.IP, error) {
	// No packet is sent: connecting a UDP socket only picks the route.
	c, err := (&net.Dialer{}).DialContext(ctx, "udp4", "198.51.100.1:9")
	if err != nil {
		return nil, fmt.Errorf("finding the machine's address (is there a default route?): %w", err)
	}
	defer func() { _ = c.Close() }()
	return c.LocalAddr().(*net.UDPAddr).IP, nil
}
