package chart_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/internal/testenv"
)

// crdUpgradeCommand is step 2 of docs/versioning.md's "Upgrading" (and the
// chart README's "Upgrade"): how a user applies a new release's CRDs, which
// helm upgrade leaves alone.
const crdUpgradeCommand = "kubectl apply --server-side --force-conflicts -f charts/sharder/crds/"

// TestCRDUpgradeAsDocumented installs the chart with helm into a bare API
// server, as a user's first install does (helm creates the CRDs of crds/),
// then applies a next release's CRD (one field's description changed) with
// the command docs/versioning.md gives: the CRD changes, although helm owns
// its fields. Without --force-conflicts the same apply is refused.
func TestCRDUpgradeAsDocumented(t *testing.T) {
	g := NewWithT(t)
	root := repoRoot(t)
	doc, err := os.ReadFile(filepath.Join(root, "docs", "versioning.md"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(doc)).To(ContainSubstring("`"+crdUpgradeCommand+"`"), "docs/versioning.md gives the command this test runs")
	readme, err := os.ReadFile("README.md")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(readme)).To(ContainSubstring("\n"+crdUpgradeCommand+"\n"), "the chart's README gives the command this test runs")

	bare, err := testenv.Start(testenv.Options{})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = bare.Stop() })
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	g.Expect(bare.WriteKubeConfig(kubeconfig)).To(Succeed())
	out, err := helm(t, "install", "sharder", ".", "--namespace", "sharder-system", "--create-namespace", "--kubeconfig", kubeconfig)
	g.Expect(err).NotTo(HaveOccurred(), out)

	// The next release's CRDs: this tree's, with one description changed.
	crds, err := filepath.Glob(filepath.Join("crds", "*.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(crds).NotTo(BeEmpty())
	next := filepath.Join(t.TempDir(), "crds")
	g.Expect(os.Mkdir(next, 0o755)).To(Succeed())
	const marker = "Changed in the next release."
	changed := false
	for _, f := range crds {
		data, err := os.ReadFile(f)
		g.Expect(err).NotTo(HaveOccurred())
		text := string(data)
		if strings.Contains(text, "name: controllerrings.sharder.dev") {
			before := text
			text = strings.Replace(text, "DrainTimeout is how long", marker+" DrainTimeout is how long", 1)
			changed = text != before
		}
		g.Expect(os.WriteFile(filepath.Join(next, filepath.Base(f)), []byte(text), 0o600)).To(Succeed())
	}
	g.Expect(changed).To(BeTrue(), "the ControllerRing CRD has the description this test changes")

	args := strings.Fields(crdUpgradeCommand)[1:] // kubectl's own
	args[len(args)-1] = next
	without := make([]string, 0, len(args))
	for _, a := range args {
		if a != "--force-conflicts" {
			without = append(without, a)
		}
	}
	g.Expect(kubectlErr(t, bare, without...)).To(MatchError(ContainSubstring("conflict")),
		"without --force-conflicts the apply is refused: helm owns the CRD's fields")
	g.Expect(kubectlErr(t, bare, args...)).To(Succeed())

	crd := &unstructured.Unstructured{}
	crd.SetAPIVersion("apiextensions.k8s.io/v1")
	crd.SetKind("CustomResourceDefinition")
	g.Expect(bare.Client.Get(t.Context(), client.ObjectKey{Name: "controllerrings.sharder.dev"}, crd)).To(Succeed())
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	g.Expect(versions).NotTo(BeEmpty())
	description, _, _ := unstructured.NestedString(versions[0].(map[string]any),
		"schema", "openAPIV3Schema", "properties", "spec", "properties", "drainTimeout", "description")
	g.Expect(description).To(HavePrefix(marker), "the new CRD is applied")
}

// kubectlErr runs the control plane's kubectl against env as its admin and
// returns its error, with its output in it.
func kubectlErr(t *testing.T, env *testenv.Env, args ...string) error {
	t.Helper()
	dir, err := testenv.AssetsDir()
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := env.WriteKubeConfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(dir, "kubectl"), append([]string{"--kubeconfig", kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return nil
}
