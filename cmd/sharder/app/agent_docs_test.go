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
// every container defines the variables its $(NAME) references name, and the
// API server accepts the pod.
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
			for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
				g.Expect(undefinedReferences(c)).To(BeEmpty(),
					"%s: container %s refers to variables it does not define (Kubernetes expands $(NAME) only from the container's own env)", rel, c.Name)
			}

			if len(spec.Containers) == 0 {
				spec.Containers = []corev1.Container{{Name: "controller", Image: "example.dev/controller:v1"}}
			}
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "documented-"}, Spec: spec}
			g.Expect(env().Client.Create(context.Background(), pod, client.DryRunAll)).To(Succeed(), "%s", rel)
		}
	}
	g.Expect(found).To(BeNumerically(">=", 2), "the agent manifests of membership.md and getting-started.md")
}

var variableReference = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// undefinedReferences returns the $(NAME) references in c's command, args
// and env values whose NAME c's env does not define before them: Kubernetes
// leaves those as they are, whatever another container of the pod defines.
func undefinedReferences(c corev1.Container) []string {
	defined := map[string]bool{}
	var undefined []string
	check := func(text string) {
		for _, m := range variableReference.FindAllStringSubmatch(text, -1) {
			if !defined[m[1]] {
				undefined = append(undefined, m[0])
			}
		}
	}
	for _, e := range c.Env {
		check(e.Value)
		defined[e.Name] = true
	}
	for _, text := range slices.Concat(c.Command, c.Args) {
		check(text)
	}
	return undefined
}
