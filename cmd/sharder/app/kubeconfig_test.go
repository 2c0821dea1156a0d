package app

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"

	. "github.com/onsi/gomega"
)

// withoutCluster leaves nothing to find a cluster with: KUBECONFIG names a
// file that does not exist, and the process is not in a pod.
func withoutCluster(t *testing.T) string {
	t.Helper()
	missing := filepath.Join(t.TempDir(), "missing-kubeconfig")
	t.Setenv("KUBECONFIG", missing)
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	t.Setenv("KUBERNETES_MASTER", "")
	t.Setenv("POD_NAMESPACE", "")
	return missing
}

// TestNoClusterSaysHowToGiveOne runs the commands that talk to a cluster
// without one: the error names what is missing and the ways to give it,
// not client-go's KUBERNETES_MASTER hint nor POD_NAMESPACE.
func TestNoClusterSaysHowToGiveOne(t *testing.T) {
	for _, args := range [][]string{
		{"status"},
		{"run", "--leader-elect=false", "--webhook=false", "--metrics-bind-address=0", "--health-probe-bind-address=0"},
	} {
		t.Run(args[0], func(t *testing.T) {
			g := NewWithT(t)
			missing := withoutCluster(t)
			cmd := NewRootCommand()
			var out bytes.Buffer
			cmd.SetOut(&out)
			cmd.SetErr(&out)
			cmd.SetArgs(args)
			err := cmd.ExecuteContext(context.Background())
			g.Expect(err).To(HaveOccurred())
			msg := err.Error()
			t.Log(msg)
			g.Expect(msg).To(ContainSubstring("no cluster"))
			g.Expect(msg).To(ContainSubstring(missing), "the kubeconfig files looked at")
			g.Expect(msg).To(ContainSubstring("--kubeconfig"))
			g.Expect(msg).To(ContainSubstring("KUBECONFIG"))
			g.Expect(msg).To(ContainSubstring("in the cluster"))
			g.Expect(msg).NotTo(ContainSubstring("KUBERNETES_MASTER"))
			g.Expect(msg).NotTo(ContainSubstring("POD_NAMESPACE"))
		})
	}
}
