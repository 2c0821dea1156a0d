package chart_test

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/sharder-dev/sharder/pkg/sharder/config"
)

// boolValues returns the dotted path of every boolean in values.yaml with
// its default, sorted.
func boolValues(t *testing.T) map[string]bool {
	t.Helper()
	data, err := os.ReadFile("values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	if err := yaml.Unmarshal(data, &values); err != nil {
		t.Fatalf("values.yaml: %v", err)
	}
	found := map[string]bool{}
	var walk func(prefix string, m map[string]any)
	walk = func(prefix string, m map[string]any) {
		for k, v := range m {
			switch v := v.(type) {
			case bool:
				found[prefix+k] = v
			case map[string]any:
				walk(prefix+k+".", v)
			}
		}
	}
	walk("", values)
	return found
}

// set sets the value at a dotted path of values, creating maps on the way.
func set(values map[string]any, path string, v any) {
	keys := strings.Split(path, ".")
	for _, k := range keys[:len(keys)-1] {
		next, ok := values[k].(map[string]any)
		if !ok {
			next = map[string]any{}
			values[k] = next
		}
		values = next
	}
	values[keys[len(keys)-1]] = v
}

// withRing declares a ring, so that the per-ring objects render too.
func withRing() map[string]any {
	return map[string]any{"rings": []any{map[string]any{
		"name": "example",
		"spec": map[string]any{
			"leaseNamespace": "example-system",
			"resources":      []any{map[string]any{"group": "example.dev", "resource": "widgets"}},
		},
	}}}
}

// TestRenderEveryBoolean flips each boolean of values.yaml on its own: the
// chart renders, and the configuration file it renders loads and validates
// as `sharder run` loads it, so that no switch leaves the pods
// crash-looping on their configuration.
func TestRenderEveryBoolean(t *testing.T) {
	t.Parallel()
	// Values a flipped boolean needs to be usable at all.
	needs := map[string]map[string]any{
		"serviceAccount.create":          {"serviceAccount.name": "existing"},
		"metrics.serviceMonitor.enabled": {"metrics.certSecret": "sharder-metrics-tls"},
	}
	// What a flipped boolean promises beyond a valid configuration.
	promises := map[string]func(g Gomega, objs []*unstructured.Unstructured, cfg *config.Config){
		"rbac.create": func(g Gomega, objs []*unstructured.Unstructured, cfg *config.Config) {
			g.Expect(cfg.Webhook.OwnerClusterRole).To(BeEmpty(), "no ClusterRole of the chart to own the webhook configuration")
			for _, kind := range []string{"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"} {
				g.Expect(find(objs, kind)).To(BeEmpty(), "rbac.create: false renders no %s", kind)
			}
		},
		"metrics.secure": func(g Gomega, objs []*unstructured.Unstructured, cfg *config.Config) {
			g.Expect(cfg.Metrics.Secure).To(BeFalse())
			g.Expect(config.IsLoopback(cfg.Metrics.BindAddress)).To(BeTrue(), "plain HTTP metrics only on the loopback interface: %s", cfg.Metrics.BindAddress)
			g.Expect(find(objs, "Service")).NotTo(HaveKey("sharder-metrics"), "nothing outside the pod reaches a loopback address")
		},
		"metrics.enabled": func(g Gomega, objs []*unstructured.Unstructured, cfg *config.Config) {
			g.Expect(config.Disabled(cfg.Metrics.BindAddress)).To(BeTrue())
		},
		"webhook.enabled": func(g Gomega, _ []*unstructured.Unstructured, cfg *config.Config) {
			g.Expect(cfg.Webhook.Enabled).To(BeFalse())
		},
		"leaderElection.enabled": func(g Gomega, _ []*unstructured.Unstructured, cfg *config.Config) {
			g.Expect(cfg.LeaderElection.Enabled).To(BeFalse())
		},
		"flowControl.enabled": func(g Gomega, objs []*unstructured.Unstructured, _ *config.Config) {
			g.Expect(find(objs, "FlowSchema")).To(BeEmpty())
			g.Expect(find(objs, "PriorityLevelConfiguration")).To(BeEmpty())
		},
	}

	bools := boolValues(t)
	if len(bools) < 10 {
		t.Fatalf("found only %d booleans in values.yaml: %v", len(bools), bools)
	}
	for path := range promises {
		if _, ok := bools[path]; !ok {
			t.Errorf("%s is no boolean of values.yaml", path)
		}
	}
	paths := make([]string, 0, len(bools))
	for p := range bools {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	for _, path := range paths {
		flipped := !bools[path]
		t.Run(path+"="+strconv.FormatBool(flipped), func(t *testing.T) {
			g := NewWithT(t)
			values := withRing()
			for p, v := range needs[path] {
				set(values, p, v)
			}
			set(values, path, flipped)
			data, err := yaml.Marshal(values)
			g.Expect(err).NotTo(HaveOccurred())
			_, objs := render(t, string(data))
			cfg := sharderConfig(t, objs)
			if check, ok := promises[path]; ok {
				check(g, objs, cfg)
			}
		})
	}
}
