package chart_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// schemaOnly lists the keys values.schema.json allows that values.yaml does
// not set, by the dotted path of their parent ("" is the top level): each
// must still be named in a comment of values.yaml.
var schemaOnly = map[string][]string{
	// Helm passes global values to every chart, a subchart's too.
	"":               {"global"},
	"livenessProbe":  {"timeoutSeconds", "failureThreshold"},
	"readinessProbe": {"timeoutSeconds", "successThreshold", "failureThreshold"},
	"startupProbe":   {"initialDelaySeconds", "timeoutSeconds"},
}

func readValues(t *testing.T) (string, map[string]any) {
	t.Helper()
	data, err := os.ReadFile("values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	if err := yaml.Unmarshal(data, &values); err != nil {
		t.Fatalf("values.yaml: %v", err)
	}
	return string(data), values
}

func readSchema(t *testing.T) map[string]any {
	t.Helper()
	data, err := os.ReadFile("values.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	var schema map[string]any
	if err := json.Unmarshal(data, &schema); err != nil {
		t.Fatalf("values.schema.json: %v", err)
	}
	return schema
}

// jsonType is the JSON schema type of a value decoded from YAML.
func jsonType(v any) string {
	switch v := v.(type) {
	case map[string]any:
		return "object"
	case []any:
		return "array"
	case string:
		return "string"
	case bool:
		return "boolean"
	case float64:
		if v == float64(int64(v)) {
			return "integer"
		}
		return "number"
	case nil:
		return "null"
	}
	return "unknown"
}

// schemaTypes returns the types a schema node allows ("integer" is a
// "number" too).
func schemaTypes(node map[string]any) []string {
	var types []string
	switch t := node["type"].(type) {
	case string:
		types = []string{t}
	case []any:
		for _, s := range t {
			types = append(types, s.(string))
		}
	}
	if slices.Contains(types, "number") {
		types = append(types, "integer")
	}
	return types
}

// TestSchemaMatchesValues walks values.yaml and values.schema.json together:
// every value has its place and type in the schema, every object whose keys
// the chart owns allows no other keys, and the schema knows no key
// values.yaml does not set (but those of schemaOnly, which values.yaml
// names in its comments). The two cannot drift apart.
func TestSchemaMatchesValues(t *testing.T) {
	t.Parallel()
	text, values := readValues(t)
	schema := readSchema(t)

	var walk func(path string, v any, node map[string]any)
	walk = func(path string, v any, node map[string]any) {
		name := strings.TrimPrefix(path, ".")
		if name == "" {
			name = "the top level"
		}
		if types := schemaTypes(node); !slices.Contains(types, jsonType(v)) {
			t.Errorf("%s: values.yaml has a %s, values.schema.json allows %v", name, jsonType(v), types)
		}
		m, ok := v.(map[string]any)
		props, owned := node["properties"].(map[string]any)
		if !ok || !owned {
			// A free-form object (labels, resources, security contexts):
			// Kubernetes checks its keys, not the chart.
			return
		}
		if node["additionalProperties"] != false {
			t.Errorf("%s: the chart owns its keys, so the schema must say additionalProperties: false", name)
		}
		for k, child := range m {
			sub, ok := props[k].(map[string]any)
			if !ok {
				t.Errorf("%s is in values.yaml but not in values.schema.json", strings.TrimPrefix(path+"."+k, "."))
				continue
			}
			walk(path+"."+k, child, sub)
		}
		parent := strings.TrimPrefix(path, ".")
		for k := range props {
			where := strings.TrimPrefix(parent+"."+k, ".")
			if _, ok := m[k]; ok {
				continue
			}
			if !slices.Contains(schemaOnly[parent], k) {
				t.Errorf("%s is in values.schema.json but not in values.yaml: add it there with its comment", where)
			} else if !strings.Contains(text, k) {
				t.Errorf("%s is allowed by values.schema.json: name it in a comment of values.yaml", where)
			}
		}
	}
	walk("", values, schema)
}

// TestSchemaRejectsMistakes: a misspelt or mistyped value stops helm lint and
// helm template (and so helm install) with a message naming it.
func TestSchemaRejectsMistakes(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct{ values, want string }{
		"misspelt top-level key":    {"replicas: 3\n", "additional properties 'replicas' not allowed"},
		"misspelt nested key":       {"webhook:\n  prot: 9443\n", "at '/webhook': additional properties 'prot' not allowed"},
		"misspelt probe setting":    {"livenessProbe:\n  periodSecond: 5\n", "additional properties 'periodSecond' not allowed"},
		"misspelt ring field":       {"rings:\n- name: r\n  rabc: false\n  spec: {}\n", "additional properties 'rabc' not allowed"},
		"port as a string":          {"webhook:\n  port: \"9443\"\n", "/webhook/port"},
		"port out of range":         {"health:\n  port: 70000\n", "/health/port"},
		"boolean as a string":       {"hostNetwork: \"true\"\n", "/hostNetwork"},
		"unknown certificate mode":  {"webhook:\n  certificates:\n    mode: vault\n", "value must be one of 'self-managed', 'cert-manager'"},
		"duration without unit":     {"leaderElection:\n  leaseDuration: 15\n", "/leaderElection/leaseDuration"},
		"lendable over 100 percent": {"flowControl:\n  writes:\n    lendablePercent: 150\n", "/flowControl/writes/lendablePercent"},
		"instance account unnamed":  {"flowControl:\n  instanceServiceAccounts:\n  - {namespace: a}\n", "missing property 'name'"},
	} {
		t.Run(name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "values.yaml")
			if err := os.WriteFile(file, []byte(tc.values), 0o600); err != nil {
				t.Fatal(err)
			}
			for _, cmd := range [][]string{
				{"template", release, ".", "--namespace", namespace, "--kube-version", kubeVersion, "--values", file},
				{"lint", ".", "--strict", "--kube-version", kubeVersion, "--values", file},
			} {
				out, err := helm(t, cmd...)
				if err == nil {
					t.Fatalf("helm %s succeeded; want an error containing %q", cmd[0], tc.want)
				}
				if !strings.Contains(out, tc.want) {
					t.Fatalf("helm %s does not name the mistake %q:\n%s", cmd[0], tc.want, out)
				}
			}
		})
	}
}
