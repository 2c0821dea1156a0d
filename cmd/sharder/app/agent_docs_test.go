package app

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/sharder-dev/sharder/internal/testenv"
)

var yamlFence = regexp.MustCompile("(?ms)^```ya?ml\n(.*?)^```")

// documentedPodParts is what a YAML block of the docs may hold of a pod: a
// pod spec (under spec or not), or just its init containers.
type documentedPodParts struct {
	Spec           *corev1.PodSpec    `json:"spec"`
	InitContainers []corev1.Container `json:"initContainers"`
	Containers     []corev1.Container `json:"containers"`
}

// TestDocumentedAgentIsNativeSidecar: every manifest in the docs that runs
// `sharder agent` runs it as a native sidecar (an init container with
// restartPolicy Always, stopped after the controller), with a health URL,
// and the API server accepts the pod.
func TestDocumentedAgentIsNativeSidecar(t *testing.T) {
	g := NewWithT(t)
	root, err := testenv.RepoRoot()
	g.Expect(err).NotTo(HaveOccurred())
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	g.Expect(err).NotTo(HaveOccurred())
	files = append(files, filepath.Join(root, "README.md"))
	ns := agentNamespace(t)
	found := 0
	for _, file := range files {
		md, err := os.ReadFile(file)
		g.Expect(err).NotTo(HaveOccurred())
		rel, _ := filepath.Rel(root, file)
		for _, m := range yamlFence.FindAllSubmatch(md, -1) {
			var parts documentedPodParts
			if yaml.Unmarshal(m[1], &parts) != nil {
				continue
			}
			spec := corev1.PodSpec{InitContainers: parts.InitContainers, Containers: parts.Containers}
			if parts.Spec != nil {
				spec = *parts.Spec
			}
			isAgent := func(c corev1.Container) bool { return len(c.Args) > 0 && c.Args[0] == "agent" }
			g.Expect(slices.ContainsFunc(spec.Containers, isAgent)).To(BeFalse(),
				"%s runs sharder agent as a plain container: make it a native sidecar", rel)
			i := slices.IndexFunc(spec.InitContainers, isAgent)
			if i < 0 {
				continue
			}
			found++
			agent := spec.InitContainers[i]
			g.Expect(agent.RestartPolicy).To(HaveValue(Equal(corev1.ContainerRestartPolicyAlways)), "%s: the agent's restartPolicy", rel)
			g.Expect(agent.Args).To(ContainElement(HavePrefix("--health-url=")), "%s: the agent needs the controller's health endpoint to release its Lease", rel)
			g.Expect(agent.Env).To(ContainElement(HaveField("Name", "POD_NAME")), "%s", rel)

			if len(spec.Containers) == 0 {
				spec.Containers = []corev1.Container{{Name: "controller", Image: "example.dev/controller:v1"}}
			}
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "documented-"}, Spec: spec}
			g.Expect(env.Client.Create(context.Background(), pod, client.DryRunAll)).To(Succeed(), "%s", rel)
		}
	}
	g.Expect(found).To(BeNumerically(">=", 2), "the agent manifests of membership.md and getting-started.md")
}
