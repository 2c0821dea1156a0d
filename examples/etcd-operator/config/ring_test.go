package config_test

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	"sigs.k8s.io/yaml"

	"github.com/sharder-dev/sharder/internal/testenv"
	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// ringFile is the one definition of the etcd-operator ring.
const ringFile = "examples/etcd-operator/config/ring/controllerring.yaml"

// exampleRing is the name of the ring the example, the samples and the docs
// share.
const exampleRing = "etcd-operator"

// TestOneEtcdOperatorRing: the ring named etcd-operator is defined once, in
// ring/controllerring.yaml. config/samples includes that file, no other
// manifest declares a ring of that name, and every example of it in the
// documentation (a ControllerRing, or a ring in Helm values) has the same
// spec. Any other ring in the docs goes by another name.
func TestOneEtcdOperatorRing(t *testing.T) {
	g := NewWithT(t)
	root, err := testenv.RepoRoot()
	g.Expect(err).NotTo(HaveOccurred())
	data, err := os.ReadFile(filepath.Join(root, ringFile))
	g.Expect(err).NotTo(HaveOccurred())
	var want sharderv1alpha1.ControllerRing
	g.Expect(yaml.UnmarshalStrict(data, &want)).To(Succeed())
	g.Expect(want.Name).To(Equal(exampleRing))

	// The samples use the file.
	_, objs := build(t, filepath.Join(root, "config", "samples"))
	var samples []sharderv1alpha1.ControllerRing
	for _, o := range objs {
		if o.GetKind() == "ControllerRing" {
			var r sharderv1alpha1.ControllerRing
			decode(t, objs, "ControllerRing", o.GetName(), &r)
			samples = append(samples, r)
		}
	}
	g.Expect(samples).To(ConsistOf(HaveField("Spec", Equal(want.Spec))), "config/samples")

	// No other manifest declares it.
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			// Helm templates are not YAML until rendered; the chart's tests
			// check what they render.
			if strings.HasPrefix(d.Name(), ".") && rel != "." || d.Name() == "bin" || d.Name() == "templates" {
				return filepath.SkipDir
			}
			return nil
		}
		switch filepath.Ext(path) {
		case ".yaml", ".yml":
			if rel == ringFile {
				return nil
			}
			content, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			docs, err := testenv.DecodeObjects(content)
			g.Expect(err).NotTo(HaveOccurred(), "%s", rel)
			for _, o := range docs {
				g.Expect(o.GetKind() == "ControllerRing" && o.GetName() == exampleRing).To(BeFalse(),
					"%s declares ring %s again: include %s instead", rel, exampleRing, ringFile)
			}
		case ".md":
			content, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, block := range yamlBlocks(content) {
				for _, spec := range documentedRings(t, rel, block) {
					g.Expect(spec).To(Equal(want.Spec), "%s shows ring %s with a spec other than %s's", rel, exampleRing, ringFile)
				}
			}
		}
		return nil
	})
	g.Expect(err).NotTo(HaveOccurred())
}

var (
	fence    = regexp.MustCompile("(?ms)^```ya?ml\n(.*?)^```")
	ringName = regexp.MustCompile(`(?m)name:\s*` + exampleRing + `\s*$`)
)

// yamlBlocks returns the fenced YAML blocks of a Markdown file.
func yamlBlocks(md []byte) [][]byte {
	var out [][]byte
	for _, m := range fence.FindAllSubmatch(md, -1) {
		out = append(out, m[1])
	}
	return out
}

// documentedRings returns the specs of the rings named exampleRing a YAML
// block shows: ControllerRing documents, and entries of a Helm values
// `rings` list. A block naming the ring must parse.
func documentedRings(t *testing.T, file string, block []byte) []sharderv1alpha1.ControllerRingSpec {
	t.Helper()
	if !ringName.Match(block) || (!bytes.Contains(block, []byte("kind: ControllerRing")) && !bytes.Contains(block, []byte("rings:"))) {
		return nil
	}
	docs, err := testenv.DecodeObjects(block)
	if err != nil {
		t.Fatalf("%s: a YAML block about ring %s does not parse: %v\n%s", file, exampleRing, err, block)
	}
	var out []sharderv1alpha1.ControllerRingSpec
	for _, doc := range docs {
		if doc.GetKind() == "ControllerRing" && doc.GetName() == exampleRing {
			var r sharderv1alpha1.ControllerRing
			decodeStrict(t, file, doc.Object, &r)
			out = append(out, r.Spec)
		}
		rings, _ := doc.Object["rings"].([]any)
		for _, entry := range rings {
			m, _ := entry.(map[string]any)
			if m["name"] == exampleRing {
				var spec sharderv1alpha1.ControllerRingSpec
				decodeStrict(t, file, m["spec"], &spec)
				out = append(out, spec)
			}
		}
	}
	return out
}

func decodeStrict(t *testing.T, file string, in, out any) {
	t.Helper()
	data, err := yaml.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(data, out); err != nil {
		t.Fatalf("%s: ring %s: %v", file, exampleRing, err)
	}
}
