package chart_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/sharder-dev/sharder/internal/testenv"
	"github.com/sharder-dev/sharder/pkg/sharder/config"
)

// The release the alert tests render: its Lease is not named "sharder", so
// that an alert that hard-codes the name fails (testdata/alerts.test.yaml).
const (
	alertsRelease   = "platform"
	alertsNamespace = "platform-system"
	alertsFullname  = "platform-sharder"
)

// promtool runs bin/promtool, built from Go modules by make promtool, with
// args in dir.
func promtool(t *testing.T, dir string, args ...string) (string, error) {
	t.Helper()
	bin := filepath.Join(repoRoot(t), "bin", "promtool")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("promtool not found at %s: run `make promtool` (make test builds it first)", bin)
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// alertRule is one alerting rule of the chart's PrometheusRule.
type alertRule struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

// renderAlerts renders the chart as alertsRelease with the PrometheusRule
// and extra values, and returns the rule's spec (a Prometheus rule file:
// groups) and the rendered objects.
func renderAlerts(t *testing.T, values string) (map[string]any, []*unstructured.Unstructured) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(file, []byte("prometheusRule:\n  enabled: true\n"+values), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := helm(t, "template", alertsRelease, ".", "--namespace", alertsNamespace, "--kube-version", kubeVersion, "--values", file)
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	objs, err := testenv.DecodeObjects([]byte(out))
	if err != nil {
		t.Fatalf("decoding the rendered chart: %v", err)
	}
	rule := find(objs, "PrometheusRule")[alertsFullname]
	if rule == nil {
		t.Fatalf("no PrometheusRule %s rendered", alertsFullname)
	}
	spec, _, _ := unstructured.NestedMap(rule.Object, "spec")
	return spec, objs
}

// alertsOf returns the alerting rules of a rule file's groups, by name.
func alertsOf(t *testing.T, spec map[string]any) map[string]alertRule {
	t.Helper()
	var file struct {
		Groups []struct {
			Name  string      `json:"name"`
			Rules []alertRule `json:"rules"`
		} `json:"groups"`
	}
	data, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(data, &file); err != nil {
		t.Fatalf("the PrometheusRule's groups: %v", err)
	}
	alerts := map[string]alertRule{}
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			alerts[r.Alert] = r
		}
	}
	return alerts
}

// writeYAML writes v as YAML to dir/name.
func writeYAML(t *testing.T, dir, name string, v any) {
	t.Helper()
	data, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestAlerts runs the chart's alerting rules in Prometheus's rule engine
// (promtool test rules) on the series of testdata/alerts.test.yaml: each
// alert fires in the situation it describes and stays silent in a healthy
// run, and forced moves alert only on rings whose instances acknowledge
// drains.
func TestAlerts(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	spec, objs := renderAlerts(t, "")
	alerts := alertsOf(t, spec)
	g.Expect(alerts).To(HaveLen(4))

	// The Lease the leader alert watches is the one the sharder elects its
	// leader with.
	cm := as[corev1.ConfigMap](t, find(objs, "ConfigMap")[alertsFullname+"-config"])
	cfg := config.Default()
	g.Expect(config.Load([]byte(cm.Data["config.yaml"]), cfg)).To(Succeed())
	g.Expect(cfg.LeaderElection.LeaseName).To(Equal(alertsFullname))
	g.Expect(alerts["SharderNoLeader"].Expr).To(ContainSubstring(fmt.Sprintf("name=%q", cfg.LeaderElection.LeaseName)))

	// Each alert has a severity, a summary, a description and a runbook
	// section in docs/operations.md.
	runbook, err := os.ReadFile(filepath.Join(repoRoot(t), "docs", "operations.md"))
	g.Expect(err).NotTo(HaveOccurred())
	for name, a := range alerts {
		g.Expect(a.Labels).To(HaveKeyWithValue("severity", Not(BeEmpty())), name)
		g.Expect(a.Annotations).To(HaveKeyWithValue("summary", Not(BeEmpty())), name)
		g.Expect(a.Annotations).To(HaveKeyWithValue("description", Not(BeEmpty())), name)
		g.Expect(a.Annotations).To(HaveKeyWithValue("runbook_url", HaveSuffix("docs/operations.md#"+strings.ToLower(name))), name)
		g.Expect(string(runbook)).To(MatchRegexp(`(?m)^### %s$`, name), "the runbook section of %s", name)
	}

	// Every alert is tested firing and silent.
	testFile, err := os.ReadFile(filepath.Join("testdata", "alerts.test.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	var tests struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string `json:"alertname"`
				ExpAlerts []any  `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	g.Expect(yaml.Unmarshal(testFile, &tests)).To(Succeed())
	fires, silent := map[string]bool{}, map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				silent[a.Alertname] = true
			}
		}
	}
	for name := range alerts {
		g.Expect(fires).To(HaveKey(name), "a test in which %s fires", name)
		g.Expect(silent).To(HaveKey(name), "a test in which %s stays silent", name)
	}

	dir := t.TempDir()
	writeYAML(t, dir, "rules.yaml", spec)
	g.Expect(os.WriteFile(filepath.Join(dir, "alerts.test.yaml"), testFile, 0o600)).To(Succeed())
	out, err := promtool(t, dir, "check", "rules", "rules.yaml")
	g.Expect(err).NotTo(HaveOccurred(), "promtool check rules:\n%s", out)
	out, err = promtool(t, dir, "test", "rules", "alerts.test.yaml")
	g.Expect(err).NotTo(HaveOccurred(), "promtool test rules:\n%s", out)
}

// TestRenderPrometheusRule checks what the prometheusRule values change.
func TestRenderPrometheusRule(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)

	_, objs := render(t, "")
	g.Expect(find(objs, "PrometheusRule")).To(BeEmpty(), "opt-in")

	spec, objs := renderAlerts(t, `
  additionalLabels: {release: prometheus}
  alertLabels: {team: platform}
  runbookURL: https://docs.example/sharder/operations.md
  alerts:
    SharderForcedMoves: {for: 10m, severity: info}
leaderElection:
  enabled: false
replicaCount: 1
`)
	g.Expect(find(objs, "PrometheusRule")[alertsFullname].GetLabels()).To(HaveKeyWithValue("release", "prometheus"))
	alerts := alertsOf(t, spec)
	g.Expect(alerts).NotTo(HaveKey("SharderNoLeader"), "without leader election there is no leader to miss")
	g.Expect(alerts).To(HaveLen(3))
	forced := alerts["SharderForcedMoves"]
	g.Expect(forced.For).To(Equal("10m"))
	g.Expect(forced.Labels).To(Equal(map[string]string{"severity": "info", "team": "platform"}))
	g.Expect(forced.Annotations).To(HaveKeyWithValue("runbook_url", "https://docs.example/sharder/operations.md#sharderforcedmoves"))
	g.Expect(alerts["SharderNoReadyInstance"].For).To(Equal("2m"), "the default of the others stays")

	out, err := renderErr(t, "prometheusRule:\n  enabled: true\nmetrics:\n  secure: false\n")
	g.Expect(err).To(HaveOccurred())
	g.Expect(out).To(ContainSubstring("prometheusRule needs metrics.enabled and metrics.secure"))
}

// grafanaVariableRE finds a Grafana variable in a query: $name or ${name}.
var grafanaVariableRE = regexp.MustCompile(`\$\{?(\w+)\}?`)

// TestDashboardQueries checks that every query of the dashboard is PromQL
// that Prometheus accepts: each becomes a recording rule, with the Grafana
// variables replaced, and promtool checks the rule file.
func TestDashboardQueries(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	data, err := os.ReadFile(filepath.Join("dashboards", "rings.json"))
	g.Expect(err).NotTo(HaveOccurred())
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	g.Expect(json.Unmarshal(data, &dash)).To(Succeed())

	var rules []map[string]string
	for _, p := range dash.Panels {
		for _, target := range p.Targets {
			expr := grafanaVariableRE.ReplaceAllStringFunc(target.Expr, func(v string) string {
				switch name := grafanaVariableRE.FindStringSubmatch(v)[1]; name {
				case "__rate_interval", "__interval", "__range":
					return "5m"
				default:
					return ".*" // a label value matched with =~
				}
			})
			rules = append(rules, map[string]string{"record": fmt.Sprintf("dashboard:query_%d", len(rules)), "expr": expr})
		}
	}
	g.Expect(rules).NotTo(BeEmpty())

	dir := t.TempDir()
	writeYAML(t, dir, "dashboard.yaml", map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	out, err := promtool(t, dir, "check", "rules", "dashboard.yaml")
	g.Expect(err).NotTo(HaveOccurred(), "promtool check rules on the dashboard's queries:\n%s", out)
}
