package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// up starts the cluster. It returns once the node is Ready, kube-proxy has
// programmed the Services and the default namespace has its ServiceAccount.
func up(ctx context.Context, l layout, controlPlane, node, images, pauseImage string) error {
	// Whatever an earlier run left (it may have been killed) goes first.
	if err := down(ctx, l); err != nil {
		return fmt.Errorf("cleaning up an earlier cluster: %w", err)
	}
	_ = os.RemoveAll(l.path("logs"))
	if err := checkDisk(l.dir); err != nil {
		return err
	}
	if err := ensurePackages(ctx); err != nil {
		return err
	}
	ip, err := hostIP(ctx)
	if err != nil {
		return err
	}
	if err := saveHost(ctx, l); err != nil {
		return fmt.Errorf("saving the host's settings: %w", err)
	}
	if err := writePKI(l, ip.String()); err != nil {
		return fmt.Errorf("writing certificates: %w", err)
	}
	if err := writeConfigs(l, pauseImage); err != nil {
		return err
	}
	if err := createCgroups(); err != nil {
		return err
	}

	cs, err := adminClient(l)
	if err != nil {
		return err
	}
	argv := args(l, ip.String())
	procs := map[string]*proc{}
	run := func(name, dir string) error {
		p, err := start(l, name, filepath.Join(dir, name), argv[name], node)
		procs[name] = p
		return err
	}
	// waitFor polls check until it succeeds, failing at once if a started
	// process has exited.
	waitFor := func(what string, check func(context.Context) error) error {
		var last error
		err := wait.PollUntilContextCancel(ctx, 250*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			for _, p := range procs {
				if err := p.failed(l); err != nil {
					return false, err
				}
			}
			last = check(ctx)
			return last == nil, nil
		})
		if err != nil && last != nil {
			return fmt.Errorf("waiting for %s: %w (last: %w)", what, err, last)
		}
		if err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		return nil
	}

	if err := run("etcd", controlPlane); err != nil {
		return err
	}
	if err := waitFor("etcd", httpOK(fmt.Sprintf("http://127.0.0.1:%d/health", etcdPort))); err != nil {
		return err
	}
	if err := run("kube-apiserver", controlPlane); err != nil {
		return err
	}
	if err := waitFor("kube-apiserver", func(ctx context.Context) error {
		_, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err
	}); err != nil {
		return err
	}
	// The cluster's DNS, before any pod: the kubelet points pods at it.
	if err := waitFor("the kube-dns Service", func(ctx context.Context) error {
		return ensureDNSService(ctx, cs, ip.String())
	}); err != nil {
		return err
	}
	dns, err := startDNS(l, ip.String())
	procs[dnsBinary] = dns
	if err != nil {
		return err
	}
	for _, name := range []string{"kube-controller-manager", "kube-scheduler", "containerd"} {
		if err := run(name, node); err != nil {
			return err
		}
	}
	ctr := func(args ...string) *exec.Cmd {
		return exec.CommandContext(ctx, filepath.Join(node, "ctr"), append([]string{"--address", l.socket(), "--namespace", "k8s.io"}, args...)...) //nolint:gosec // the ctr built by make node
	}
	if err := waitFor("containerd", func(context.Context) error { return ctr("version").Run() }); err != nil {
		return err
	}
	// The images are there before the kubelet starts: nothing can be pulled.
	tarballs, _ := filepath.Glob(filepath.Join(images, "*.tar"))
	if len(tarballs) == 0 {
		return fmt.Errorf("no image tarballs in %s (make images)", images)
	}
	for _, t := range tarballs {
		if out, err := ctr("images", "import", t).CombinedOutput(); err != nil {
			return fmt.Errorf("importing %s: %w: %s", t, err, out)
		}
	}
	for _, name := range []string{"kubelet", "kube-proxy"} {
		if err := run(name, node); err != nil {
			return err
		}
	}
	if err := waitFor("the node to be Ready", func(ctx context.Context) error {
		n, err := cs.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				return nil
			}
		}
		return fmt.Errorf("node %s is not Ready", nodeName)
	}); err != nil {
		return err
	}
	// kube-proxy is healthy once it has synced the Services: the API server
	// reaches webhooks through their ClusterIPs from then on.
	if err := waitFor("kube-proxy", httpOK(fmt.Sprintf("http://127.0.0.1:%d/healthz", proxyHealthz))); err != nil {
		return err
	}
	return waitFor("the default ServiceAccount", func(ctx context.Context) error {
		_, err := cs.CoreV1().ServiceAccounts(metav1.NamespaceDefault).Get(ctx, "default", metav1.GetOptions{})
		return err
	})
}

// writePKI writes the certificates, the ServiceAccount keys and the
// kubeconfigs of every component.
func writePKI(l layout, ip string) error {
	p, err := newPKI(l)
	if err != nil {
		return err
	}
	certs := []struct {
		name, cn string
		orgs     []string
		hosts    []string
	}{
		{"apiserver", "kube-apiserver", nil, []string{
			"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local",
			"localhost", "127.0.0.1", kubernetesSvcIP, ip,
		}},
		{"apiserver-kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"}, nil},
		{"kubelet-serving", "system:node:" + nodeName, []string{"system:nodes"}, []string{nodeName, "localhost", "127.0.0.1", ip}},
		{"admin", "admin", []string{"system:masters"}, nil},
		{"kube-controller-manager", "system:kube-controller-manager", nil, nil},
		{"kube-scheduler", "system:kube-scheduler", nil, nil},
		{"kube-proxy", "system:kube-proxy", nil, nil},
		{"kubelet", "system:node:" + nodeName, []string{"system:nodes"}, nil},
	}
	for _, c := range certs {
		if err := p.issue(c.name, c.cn, c.orgs, c.hosts...); err != nil {
			return err
		}
	}
	if err := p.keyPair("sa"); err != nil {
		return err
	}
	server := fmt.Sprintf("https://127.0.0.1:%d", apiServerPort)
	if err := p.kubeconfig(l.kubeconfig(), "admin", server); err != nil {
		return err
	}
	for _, name := range []string{"kube-controller-manager", "kube-scheduler", "kube-proxy", "kubelet"} {
		if err := p.kubeconfig(l.path("etc", name+".kubeconfig"), name, server); err != nil {
			return err
		}
	}
	return nil
}

func adminClient(l layout) (*kubernetes.Clientset, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", l.kubeconfig())
	if err != nil {
		return nil, err
	}
	cfg.Timeout = 5 * time.Second
	return kubernetes.NewForConfig(cfg)
}

func httpOK(url string) func(context.Context) error {
	client := &http.Client{Timeout: 2 * time.Second}
	return func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %s", url, resp.Status)
		}
		return nil
	}
}
