package app

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/sharder-dev/sharder/pkg/sharder/webhook"
)

// clusterFlags selects the cluster a command talks to, as kubectl does:
// --kubeconfig, else $KUBECONFIG, else ~/.kube/config, else the in-cluster
// service account.
type clusterFlags struct {
	kubeconfig string
	context    string
}

func (f *clusterFlags) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "Path to a kubeconfig file. Default: $KUBECONFIG, ~/.kube/config, then the in-cluster service account.")
	fs.StringVar(&f.context, "context", "", "The kubeconfig context to use. Default: the current context.")
}

func (f *clusterFlags) loadingRules() *clientcmd.ClientConfigLoadingRules {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = f.kubeconfig
	return rules
}

func (f *clusterFlags) clientConfig() clientcmd.ClientConfig {
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(f.loadingRules(), &clientcmd.ConfigOverrides{CurrentContext: f.context})
}

// noCluster replaces client-go's answer to an empty configuration
// (clientcmd.IsEmptyConfig), which suggests the KUBERNETES_MASTER variable,
// with what was looked at and the ways to name a cluster.
func (f *clusterFlags) noCluster() error {
	looked := "no kubeconfig file"
	if files := f.loadingRules().GetLoadingPrecedence(); len(files) > 0 {
		looked = "no usable kubeconfig in " + strings.Join(files, ", ")
		if os.Getenv(clientcmd.RecommendedConfigPathEnvVar) != "" {
			looked += " (from $" + clientcmd.RecommendedConfigPathEnvVar + ")"
		}
	}
	inCluster := "not running in a pod (KUBERNETES_SERVICE_HOST is not set)"
	if os.Getenv("KUBERNETES_SERVICE_HOST") != "" {
		inCluster = "no in-cluster service account (KUBERNETES_SERVICE_PORT unset or no token mounted at " +
			"/var/run/secrets/kubernetes.io/serviceaccount/token)"
	}
	return fmt.Errorf("no cluster to talk to: %s, and %s; name a kubeconfig with --kubeconfig PATH or the %s environment variable, "+
		"or run in the cluster", looked, inCluster, clientcmd.RecommendedConfigPathEnvVar)
}

// restConfig returns the rest config with the sharder's user agent.
func (f *clusterFlags) restConfig() (*rest.Config, error) {
	cfg, err := f.clientConfig().ClientConfig()
	if clientcmd.IsEmptyConfig(err) {
		return nil, f.noCluster()
	}
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig: %w", err)
	}
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = "sharder/" + Version()
	return cfg, nil
}

// namespace returns the namespace the command runs in: its pod's
// (webhook.PodNamespace), else the kubeconfig context's namespace.
func (f *clusterFlags) namespace() (string, error) {
	if ns := webhook.PodNamespace(); ns != "" {
		return ns, nil
	}
	ns, _, err := f.clientConfig().Namespace()
	if clientcmd.IsEmptyConfig(err) {
		return "", f.noCluster()
	}
	if err != nil {
		return "", fmt.Errorf("finding the namespace to run in from the kubeconfig (or set POD_NAMESPACE): %w", err)
	}
	return ns, nil
}
