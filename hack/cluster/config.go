package main

import (
	"fmt"
	"os"
	"path/filepath"
)

// writeConfigs writes containerd's, the CNI's, the kubelet's and kube-proxy's
// configuration files under DIR/etc.
func writeConfigs(l layout, pauseImage string) error {
	files := map[string]string{
		"containerd.toml":           containerdConfig(l, pauseImage),
		"net.d/10-sharder.conflist": cniConfig(l),
		"kubelet.yaml":              kubeletConfig(l),
		"kube-proxy.yaml":           kubeProxyConfig(l),
		// The local registry, over plain HTTP (registryHost).
		"certs.d/" + registryHost + "/hosts.toml": registryHostsConfig(),
	}
	for name, content := range files {
		path := l.path("etc", name)
		if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
			return err
		}
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			return err
		}
	}
	return nil
}

// containerdConfig: a containerd of its own (root, state, socket, and the
// opt folder it would otherwise create in /opt), CRI only. restrict_oom_score_adj because the machine may lack
// CAP_SYS_RESOURCE, in which case runc cannot lower a score and every
// sandbox fails to start. NRI is off: nothing here uses it.
func containerdConfig(l layout, pauseImage string) string {
	return fmt.Sprintf(`version = 3
root = %q
state = %q
disabled_plugins = ["io.containerd.nri.v1.nri"]

[grpc]
  address = %q

[plugins."io.containerd.internal.v1.opt"]
  path = %q

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = %q
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = %q

[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "/usr/sbin/runc"
        Root = %q
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = %q
`, l.path("containerd", "root"), l.path("containerd", "state"), l.socket(), l.path("containerd", "opt"), pauseImage,
		l.path("etc", "certs.d"), l.path("containerd", "runc"), l.path("etc", "net.d"))
}

// registryHostsConfig: containerd pulls images named registryHost/... from
// the registry there over plain HTTP. Nothing of the cluster serves it: it
// is where whoever uses the cluster runs a registry to push to (the
// real-cluster suite does, with the images and the chart it installs).
func registryHostsConfig() string {
	return fmt.Sprintf(`server = "http://%[1]s"

[host."http://%[1]s"]
  capabilities = ["pull", "resolve"]
`, registryHost)
}

// cniConfig: one bridge, masquerading to the outside, hairpin so that a pod
// reaches itself through a Service.
func cniConfig(l layout) string {
	return fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": %q,
  "plugins": [
    {
      "type": "bridge",
      "bridge": %q,
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": %q}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": %q
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, cniNetwork, bridgeName, podCIDR, l.path("cni"))
}

// kubeletConfig: cgroupfs under a cgroup of its own (PID 1 is not systemd;
// cgroup v1 is allowed), the cluster's DNS (dns.go), no image garbage collection (nothing can be
// pulled back), eviction only when the machine is nearly full.
func kubeletConfig(l layout) string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://%s
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /%s
failSwapOn: false
port: %d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %d
tlsCertFile: %s
tlsPrivateKeyFile: %s
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: %s
authorization:
  mode: Webhook
podLogsDir: %s
volumePluginDir: %s
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%%
  imagefs.available: 1%%
  nodefs.inodesFree: 1%%
rotateCertificates: false
serverTLSBootstrap: false
clusterDNS: [%s]
clusterDomain: %s
`, l.socket(), cgroupRoot, kubeletPort, kubeletHealthz,
		l.pki("kubelet-serving.crt"), l.pki("kubelet-serving.key"), l.pki("ca.crt"), l.path("pod-logs"), l.path("kubelet-plugins"), dnsSvcIP, clusterDomain)
}

// kubeProxyConfig: iptables mode. The conntrack settings are left as the
// machine has them (a zero means: do not set), and localhost NodePorts are off
// so that route_localnet is not touched.
func kubeProxyConfig(l layout) string {
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: %s
mode: iptables
hostnameOverride: %s
clusterCIDR: %s
healthzBindAddress: 127.0.0.1:%d
metricsBindAddress: 127.0.0.1:%d
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
iptables:
  localhostNodePorts: false
`, l.path("etc", "kube-proxy.kubeconfig"), nodeName, podCIDR, proxyHealthz, proxyMetrics)
}

// args are the command lines of the processes, in start order.
func args(l layout, hostIP string) map[string][]string {
	pki := l.pki
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", etcdPort)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", etcdPeerPort)
	return map[string][]string{
		"etcd": {
			"--name=default", "--data-dir=" + l.path("etcd"),
			"--listen-client-urls=" + etcdURL, "--advertise-client-urls=" + etcdURL,
			"--listen-peer-urls=" + peerURL, "--initial-advertise-peer-urls=" + peerURL,
			"--initial-cluster=default=" + peerURL,
			// A throwaway cluster: durability buys nothing, fsync costs seconds.
			"--unsafe-no-fsync",
		},
		"kube-apiserver": {
			"--etcd-servers=" + etcdURL,
			fmt.Sprintf("--secure-port=%d", apiServerPort), "--bind-address=0.0.0.0",
			"--advertise-address=" + hostIP,
			"--service-cluster-ip-range=" + serviceCIDR,
			"--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
			"--allow-privileged=true",
			"--client-ca-file=" + pki("ca.crt"),
			"--tls-cert-file=" + pki("apiserver.crt"), "--tls-private-key-file=" + pki("apiserver.key"),
			"--kubelet-client-certificate=" + pki("apiserver-kubelet-client.crt"),
			"--kubelet-client-key=" + pki("apiserver-kubelet-client.key"),
			"--kubelet-certificate-authority=" + pki("ca.crt"),
			"--kubelet-preferred-address-types=InternalIP",
			"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
			"--service-account-key-file=" + pki("sa.pub"),
			"--service-account-signing-key-file=" + pki("sa.key"),
		},
		"kube-controller-manager": {
			"--kubeconfig=" + l.path("etc", "kube-controller-manager.kubeconfig"),
			"--authentication-kubeconfig=" + l.path("etc", "kube-controller-manager.kubeconfig"),
			"--authorization-kubeconfig=" + l.path("etc", "kube-controller-manager.kubeconfig"),
			"--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", kcmPort),
			"--leader-elect=false", "--use-service-account-credentials",
			"--service-account-private-key-file=" + pki("sa.key"),
			"--root-ca-file=" + pki("ca.crt"),
			"--cluster-signing-cert-file=" + pki("ca.crt"), "--cluster-signing-key-file=" + pki("ca.key"),
			"--service-cluster-ip-range=" + serviceCIDR,
			// Its default is under /usr/libexec, which it would create.
			"--flex-volume-plugin-dir=" + l.path("kubelet-plugins"),
		},
		"kube-scheduler": {
			"--kubeconfig=" + l.path("etc", "kube-scheduler.kubeconfig"),
			"--authentication-kubeconfig=" + l.path("etc", "kube-scheduler.kubeconfig"),
			"--authorization-kubeconfig=" + l.path("etc", "kube-scheduler.kubeconfig"),
			"--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", schedulerPort),
			"--leader-elect=false",
		},
		"containerd": {"--config=" + l.path("etc", "containerd.toml")},
		"kubelet": {
			"--config=" + l.path("etc", "kubelet.yaml"),
			"--kubeconfig=" + l.path("etc", "kubelet.kubeconfig"),
			"--root-dir=" + l.path("kubelet"),
			"--cert-dir=" + l.path("kubelet", "pki"),
			"--hostname-override=" + nodeName,
			"--node-ip=" + hostIP,
		},
		"kube-proxy": {"--config=" + l.path("etc", "kube-proxy.yaml")},
	}
}
