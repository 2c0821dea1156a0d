package app

import (
	"fmt"
	"os"

	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
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

func (f *clusterFlags) clientConfig() clientcmd.ClientConfig {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = f.kubeconfig
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: f.context})
}

// restConfig returns the rest config with the sharder's user agent.
func (f *clusterFlags) restConfig() (*rest.Config, error) {
	cfg, err := f.clientConfig().ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig: %w", err)
	}
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = "sharder/" + Version()
	return cfg, nil
}

// namespace returns the namespace the command runs in: $POD_NAMESPACE (set
// from the downward API in the sharder's Deployment), else the in-cluster
// service account's namespace or the kubeconfig context's namespace.
func (f *clusterFlags) namespace() (string, error) {
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns, nil
	}
	ns, _, err := f.clientConfig().Namespace()
	if err != nil {
		return "", fmt.Errorf("finding the namespace to run in (set POD_NAMESPACE): %w", err)
	}
	return ns, nil
}
