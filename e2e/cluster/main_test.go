package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	etcdv1alpha1 "github.com/sharder-dev/sharder/examples/etcd-operator/api/v1alpha1"

	"github.com/sharder-dev/sharder/internal/localrun"
	"github.com/sharder-dev/sharder/internal/testenv"
)

// repoRoot is the repository root, seen from this package.
var repoRoot, _ = filepath.Abs("../..")

var (
	// kubeconfig is the cluster's admin kubeconfig.
	kubeconfig = filepath.Join(repoRoot, "bin", "cluster", "kubeconfig")
	// restConfig and k8sClient are the cluster's admin.
	restConfig *rest.Config
	k8sClient  client.Client
	// toolHome holds kubectl's and helm's caches and settings, which would
	// otherwise go to $HOME.
	toolHome string
)

func TestMain(m *testing.M) { os.Exit(runSuite(m)) }

func runSuite(m *testing.M) int {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "e2e/cluster: the real-cluster suite runs a kubelet and containerd and needs root; run it as root (CI does)")
		return 1
	}
	var err error
	if toolHome, err = os.MkdirTemp("", "sharder-e2e-cluster-"); err != nil {
		fmt.Fprintf(os.Stderr, "e2e/cluster: %v\n", err)
		return 1
	}
	defer func() { _ = os.RemoveAll(toolHome) }()
	start := time.Now()
	if err := makeTarget("cluster"); err != nil {
		fmt.Fprintf(os.Stderr, "e2e/cluster: cannot start the cluster: %v\n", err)
		if err := makeTarget("cluster-down"); err != nil {
			fmt.Fprintf(os.Stderr, "e2e/cluster: cleaning up: %v\n", err)
		}
		return 1
	}
	fmt.Fprintf(os.Stderr, "e2e/cluster: cluster up in %s\n", time.Since(start).Round(time.Second))
	code := func() int {
		stopRegistry, err := startRegistry()
		if err != nil {
			fmt.Fprintf(os.Stderr, "e2e/cluster: %v\n", err)
			return 1
		}
		defer stopRegistry()
		restConfig, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			fmt.Fprintf(os.Stderr, "e2e/cluster: %v\n", err)
			return 1
		}
		scheme := localrun.Scheme()
		utilruntime.Must(etcdv1alpha1.AddToScheme(scheme))
		k8sClient, err = client.New(restConfig, client.Options{Scheme: scheme})
		if err != nil {
			fmt.Fprintf(os.Stderr, "e2e/cluster: %v\n", err)
			return 1
		}
		return m.Run()
	}()
	if err := makeTarget("cluster-down"); err != nil {
		fmt.Fprintf(os.Stderr, "e2e/cluster: stopping the cluster: %v\n", err)
		code = 1
	}
	return code
}

// makeTarget runs a target of the repository's Makefile, with its output on
// stderr.
func makeTarget(target string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "make", "--no-print-directory", "-C", repoRoot, target)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	return cmd.Run()
}

// run runs a command (kubectl or helm against the cluster) and returns its
// combined output.
func run(ctx context.Context, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig, "KUBECACHEDIR="+filepath.Join(toolHome, "kube"),
		"HELM_CACHE_HOME="+filepath.Join(toolHome, "helm", "cache"), "HELM_CONFIG_HOME="+filepath.Join(toolHome, "helm", "config"),
		"HELM_DATA_HOME="+filepath.Join(toolHome, "helm", "data"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", filepath.Base(name), strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

func kubectl(ctx context.Context, args ...string) (string, error) {
	return run(ctx, filepath.Join(repoRoot, "bin", "k8s", testenv.KubernetesVersion+"-etcd-"+testenv.EtcdVersion, "kubectl"), args...)
}

func helm(ctx context.Context, args ...string) (string, error) {
	return run(ctx, filepath.Join(repoRoot, "bin", "helm"), args...)
}
