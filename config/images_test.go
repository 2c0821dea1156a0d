package config_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// repoRoot is the repository root, seen from this package.
const repoRoot = ".."

// makeVariables returns the `NAME := value` variables of the Makefile, with $(IMAGE_TAG)-style references to earlier variables expanded.
func makeVariables(t *testing.T) map[string]string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{}
	assign := regexp.MustCompile(`^([A-Z_]+) :?= (.*)$`)
	ref := regexp.MustCompile(`\$\(([A-Z_]+)\)`)
	for _, line := range strings.Split(string(data), "\n") {
		m := assign.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		vars[m[1]] = ref.ReplaceAllStringFunc(m[2], func(r string) string {
			return vars[ref.FindStringSubmatch(r)[1]]
		})
	}
	return vars
}

// TestImageReferencesAgree checks that the Makefile (make images), the chart,
// the kustomizations, the Dockerfiles and the docs name the sharder's, the
// example operator's, the plain controller's and the shell controller's
// images by one reference: the chart's appVersion.
func TestImageReferencesAgree(t *testing.T) {
	g := NewWithT(t)
	vars := makeVariables(t)
	sharderImage, operatorImage, plainImage := vars["SHARDER_IMAGE"], vars["OPERATOR_IMAGE"], vars["PLAIN_CONTROLLER_IMAGE"]
	g.Expect(sharderImage).To(HavePrefix("ghcr.io/sharder-dev/sharder:"), "Makefile SHARDER_IMAGE")
	g.Expect(operatorImage).To(HavePrefix("ghcr.io/sharder-dev/etcd-operator:"), "Makefile OPERATOR_IMAGE")
	g.Expect(plainImage).To(HavePrefix("ghcr.io/sharder-dev/plaincontroller:"), "Makefile PLAIN_CONTROLLER_IMAGE")
	shellImage := vars["SHELL_CONTROLLER_IMAGE"]
	g.Expect(shellImage).To(HavePrefix("ghcr.io/sharder-dev/shell-controller:"), "Makefile SHELL_CONTROLLER_IMAGE")

	// The chart: its image is <repository>:<tag or appVersion>.
	var chart struct {
		AppVersion string `json:"appVersion"`
	}
	var values struct {
		Image struct {
			Repository string `json:"repository"`
			Tag        string `json:"tag"`
		} `json:"image"`
	}
	readYAML(t, filepath.Join(repoRoot, "charts/sharder/Chart.yaml"), &chart)
	readYAML(t, filepath.Join(repoRoot, "charts/sharder/values.yaml"), &values)
	tag := values.Image.Tag
	if tag == "" {
		tag = chart.AppVersion
	}
	g.Expect(values.Image.Repository+":"+tag).To(Equal(sharderImage), "chart image")
	g.Expect(vars["IMAGE_TAG"]).To(Equal(chart.AppVersion), "Makefile IMAGE_TAG is the chart's appVersion")

	// The kustomizations, as built.
	g.Expect(containerImages(t, "default")).To(ConsistOf(sharderImage), "config/default")
	g.Expect(containerImages(t, "../examples/etcd-operator/config")).To(ConsistOf(operatorImage), "examples/etcd-operator/config")
	g.Expect(containerImages(t, "../e2e/plaincontroller/config")).To(ConsistOf(sharderImage, plainImage), "e2e/plaincontroller/config")
	g.Expect(containerImages(t, "../examples/shell-controller/config")).To(ConsistOf(sharderImage, shellImage), "examples/shell-controller/config")

	// Every mention in the docs, READMEs and Dockerfiles.
	mention := regexp.MustCompile(`ghcr\.io/sharder-dev/(sharder|etcd-operator|plaincontroller|shell-controller):[^\s"'` + "`" + `)]+`)
	want := map[string]string{"sharder": sharderImage, "etcd-operator": operatorImage, "plaincontroller": plainImage, "shell-controller": shellImage}
	found := 0
	err := filepath.WalkDir(repoRoot, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); name == "bin" || name == ".git" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".md") && !strings.HasPrefix(d.Name(), "Dockerfile") {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range mention.FindAllStringSubmatch(string(data), -1) {
			found++
			g.Expect(m[0]).To(Equal(want[m[1]]), "in %s", path)
		}
		return nil
	})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(found).To(BeNumerically(">", 0), "the docs mention the images")
}

func readYAML(t *testing.T, path string, into any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, into); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// containerImages returns the images of every container of the workloads a
// kustomization builds.
func containerImages(t *testing.T, dir string) []string {
	t.Helper()
	_, objs := build(t, dir)
	var images []string
	for _, o := range objs {
		if o.GetKind() != "Deployment" && o.GetKind() != "StatefulSet" {
			continue
		}
		for _, field := range []string{"containers", "initContainers"} {
			containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", field)
			for _, c := range containers {
				if image, ok := c.(map[string]any)["image"].(string); ok {
					images = append(images, image)
				}
			}
		}
	}
	return images
}

// TestPreviousEtcdAgrees checks that the previous etcd release the Makefile
// names (its image, for the example operator's upgrade test) is the one
// hack/tools/etcd35 pins, the one the real-cluster test starts its
// EtcdCluster on, and the one docs/real-cluster.md lists.
func TestPreviousEtcdAgrees(t *testing.T) {
	g := NewWithT(t)
	version := makeVariables(t)["ETCD_PREVIOUS_VERSION"]
	g.Expect(version).To(MatchRegexp(`^v3\.5\.[0-9]+$`), "Makefile ETCD_PREVIOUS_VERSION")
	read := func(path string) string {
		data, err := os.ReadFile(filepath.Join(repoRoot, path))
		g.Expect(err).NotTo(HaveOccurred())
		return string(data)
	}
	g.Expect(read("hack/tools/etcd35/go.mod")).To(MatchRegexp(`(?m)^require go\.etcd\.io/etcd/server/v3 `+regexp.QuoteMeta(version)+`$`),
		"hack/tools/etcd35/go.mod")
	g.Expect(read("e2e/cluster/realetcd_test.go")).To(ContainSubstring(`previousEtcdVersion = "`+strings.TrimPrefix(version, "v")+`"`),
		"e2e/cluster/realetcd_test.go")
	g.Expect(read("docs/real-cluster.md")).To(ContainSubstring("gcr.io/etcd-development/etcd:"+version), "docs/real-cluster.md")
}
