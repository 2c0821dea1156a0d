package e2e

import (
	"fmt"
	"os"
	"testing"

	utilruntime "k8s.io/apimachinery/pkg/util/runtime"

	etcdv1alpha1 "github.com/sharder-dev/sharder/examples/etcd-operator/api/v1alpha1"

	"github.com/sharder-dev/sharder/internal/localrun"
)

// cluster is the control plane and binaries every scenario shares.
var cluster *localrun.Cluster

func TestMain(m *testing.M) { os.Exit(runSuite(m)) }

func runSuite(m *testing.M) int {
	dir, err := os.MkdirTemp("", "sharder-e2e-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
		return 1
	}
	scheme := localrun.Scheme()
	utilruntime.Must(etcdv1alpha1.AddToScheme(scheme))
	cluster, err = localrun.NewCluster(localrun.ClusterOptions{Dir: dir, Operator: true, PlainController: true, Scheme: scheme})
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
		return 1
	}
	code := m.Run()
	if err := cluster.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: stopping: %v\n", err)
	}
	if code == 0 {
		_ = os.RemoveAll(dir)
	} else {
		fmt.Fprintf(os.Stderr, "e2e: logs and kubeconfigs kept in %s\n", dir)
	}
	return code
}
