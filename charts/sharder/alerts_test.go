package chart_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/sharder-dev/sharder/internal/testenv"
	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/sharder/config"
	"github.com/sharder-dev/sharder/pkg/sharder/metrics"
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

	// The sharder's series of the tests are shaped as the sharder exposes
	// them: the same label names, and values the sharder writes.
	var inputs struct {
		Tests []struct {
			InputSeries []struct {
				Series string `json:"series"`
			} `json:"input_series"`
		} `json:"tests"`
	}
	g.Expect(yaml.Unmarshal(testFile, &inputs)).To(Succeed())
	exposed := map[string]map[string]bool{} // label names of each name, the label values seen
	for _, s := range sharderSeries(t) {
		name, labels := parseSeries(t, s["series"])
		if exposed[name] == nil {
			exposed[name] = map[string]bool{}
		}
		for k, v := range labels {
			exposed[name][k] = true
			exposed[name][k+"="+v] = true
		}
	}
	for _, tc := range inputs.Tests {
		for _, in := range tc.InputSeries {
			name, labels := parseSeries(t, in.Series)
			if !strings.HasPrefix(name, "sharder_") {
				continue
			}
			g.Expect(exposed).To(HaveKey(name), in.Series)
			for k, v := range labels {
				g.Expect(exposed[name]).To(HaveKey(k), "%s: the sharder sets no label %s", in.Series, k)
				if k == "state" || k == "reason" || k == metrics.LabelDrainAcknowledgements {
					g.Expect(exposed[name]).To(HaveKey(k+"="+v), "%s: the sharder writes no %s=%q", in.Series, k, v)
				}
			}
		}
	}

	dir := t.TempDir()
	writeYAML(t, dir, "rules.yaml", spec)
	g.Expect(os.WriteFile(filepath.Join(dir, "alerts.test.yaml"), testFile, 0o600)).To(Succeed())
	out, err := promtool(t, dir, "check", "rules", "rules.yaml")
	g.Expect(err).NotTo(HaveOccurred(), "promtool check rules:\n%s", out)
	out, err = promtool(t, dir, "test", "rules", "alerts.test.yaml")
	g.Expect(err).NotTo(HaveOccurred(), "promtool test rules:\n%s", out)
}

var (
	seriesRE = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\}$`)
	labelRE  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"`)
)

// parseSeries splits a series of promtool's notation, name{k="v",...}, into
// its name and labels.
func parseSeries(t *testing.T, series string) (string, map[string]string) {
	t.Helper()
	m := seriesRE.FindStringSubmatch(series)
	if m == nil {
		t.Fatalf("series %q: want name{labels}", series)
	}
	labels := map[string]string{}
	for _, l := range labelRE.FindAllStringSubmatch(m[2], -1) {
		labels[l[1]] = l[2]
	}
	return m[1], labels
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

// sharderSeries returns the series a sharder leading one ring, "widgets",
// exposes (and the info of an agent ring), as promtool input series over 30
// minutes: the families of pkg/sharder/metrics, registered and filled in as
// the sharder does, with the labels prometheus-operator adds (namespace,
// pod). Counters, sums and counts grow by their value every minute; gauges
// keep theirs.
func sharderSeries(t *testing.T) []map[string]string {
	t.Helper()
	series, err := exposedSeries()
	if err != nil {
		t.Fatal(err)
	}
	return series
}

// exposedSeries is sharderSeries, computed once: the metrics are the
// process's, and tests in parallel ask for them.
var exposedSeries = sync.OnceValues(func() ([]map[string]string, error) {
	reg := prometheus.NewRegistry()
	if err := metrics.Register(reg); err != nil {
		return nil, err
	}
	// Ring "agents" only tells the other value of sharder_ring_info.
	const ring, agents = "widgets", "agents"
	defer func() {
		metrics.ForgetRing(ring)
		metrics.ForgetLeaseRing(ring)
		metrics.ForgetWebhookRing(ring)
		metrics.ForgetRing(agents)
	}()
	metrics.SetRingInfo(ring, true)
	metrics.SetRingInfo(agents, false)
	for _, state := range membership.States { // every state, as the sharder writes them
		metrics.Instances.WithLabelValues(ring, string(state)).Set(0)
	}
	metrics.Instances.WithLabelValues(ring, string(membership.StateReady)).Set(3)
	metrics.Objects.WithLabelValues(ring, "widgets-0").Set(10)
	metrics.UnassignedObjects.WithLabelValues(ring).Set(0)
	metrics.DrainsInFlight.WithLabelValues(ring).Set(1)
	metrics.AssignmentsTotal.WithLabelValues(ring).Inc()
	for _, reason := range []string{metrics.MoveRebalance, metrics.MoveDead, metrics.MoveForced} {
		metrics.MovesTotal.WithLabelValues(ring, reason).Inc()
	}
	metrics.DrainsTotal.WithLabelValues(ring).Inc()
	metrics.DrainDuration.WithLabelValues(ring, metrics.DrainAcknowledged).Observe(0.2)
	metrics.DrainDuration.WithLabelValues(ring, metrics.DrainForced).Observe(30)
	metrics.AssignmentLatency.WithLabelValues(ring).Observe(0.01)
	metrics.CountRingRebuild(ring)
	metrics.LeaseTransitionsTotal.WithLabelValues(ring, string(membership.StateReady)).Inc()
	metrics.LeaseTakeoversTotal.WithLabelValues(ring).Inc()
	metrics.LeasesDeletedTotal.WithLabelValues(ring).Inc()
	metrics.WebhookDecisionsTotal.WithLabelValues(ring, metrics.WebhookAllowed, "acknowledgement").Inc()
	metrics.WebhookDecisionDuration.WithLabelValues(ring).Observe(0.001)
	metrics.WebhookAssignmentsTotal.WithLabelValues(ring, metrics.WebhookAssigned, "").Inc()
	metrics.WebhookAssignmentDuration.WithLabelValues(ring).Observe(0.001)

	families, err := reg.Gather()
	if err != nil {
		return nil, err
	}
	var series []map[string]string
	add := func(name string, labels []*dto.LabelPair, extra map[string]string, value float64, grows bool) {
		pairs := []string{`namespace="sharder-system"`, `pod="a"`}
		for _, l := range labels {
			pairs = append(pairs, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
		}
		for k, v := range extra {
			pairs = append(pairs, fmt.Sprintf("%s=%q", k, v))
		}
		values := fmt.Sprintf("%gx30", value)
		if grows {
			values = fmt.Sprintf("0+%gx30", value)
		}
		series = append(series, map[string]string{"series": name + "{" + strings.Join(pairs, ",") + "}", "values": values})
	}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			switch f.GetType() {
			case dto.MetricType_GAUGE:
				add(f.GetName(), m.GetLabel(), nil, m.GetGauge().GetValue(), false)
			case dto.MetricType_COUNTER:
				add(f.GetName(), m.GetLabel(), nil, m.GetCounter().GetValue(), true)
			case dto.MetricType_HISTOGRAM:
				h := m.GetHistogram()
				for _, b := range h.GetBucket() {
					add(f.GetName()+"_bucket", m.GetLabel(), map[string]string{"le": fmt.Sprint(b.GetUpperBound())}, float64(b.GetCumulativeCount()), true)
				}
				add(f.GetName()+"_bucket", m.GetLabel(), map[string]string{"le": "+Inf"}, float64(h.GetSampleCount()), true)
				add(f.GetName()+"_sum", m.GetLabel(), nil, h.GetSampleSum(), true)
				add(f.GetName()+"_count", m.GetLabel(), nil, float64(h.GetSampleCount()), true)
			default:
				return nil, fmt.Errorf("%s: a %v, which this test does not turn into series", f.GetName(), f.GetType())
			}
		}
	}
	return series, nil
})

// TestDashboardQueries checks that every query of the dashboard is PromQL
// that Prometheus accepts and evaluates to data on the series the sharder
// exposes (sharderSeries): each query becomes an alerting rule that fires
// when it has none (absent), with the Grafana variables replaced; promtool
// checks the rules, then runs them on those series and expects none to
// fire.
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

	var rules []map[string]any
	var silent []map[string]string
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
			name := fmt.Sprintf("DashboardQuery%dHasNoData", len(rules))
			rules = append(rules, map[string]any{
				"alert":       name,
				"expr":        "absent(" + expr + ")",
				"annotations": map[string]string{"panel": p.Title, "query": target.Expr},
			})
			silent = append(silent, map[string]string{"eval_time": "20m", "alertname": name})
		}
	}
	g.Expect(rules).NotTo(BeEmpty())

	dir := t.TempDir()
	writeYAML(t, dir, "dashboard.yaml", map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	out, err := promtool(t, dir, "check", "rules", "dashboard.yaml")
	g.Expect(err).NotTo(HaveOccurred(), "promtool check rules on the dashboard's queries:\n%s", out)

	writeYAML(t, dir, "dashboard.test.yaml", map[string]any{
		"rule_files":          []string{"dashboard.yaml"},
		"evaluation_interval": "1m",
		"tests": []any{map[string]any{
			"name":            "every dashboard query has data",
			"interval":        "1m",
			"input_series":    sharderSeries(t),
			"alert_rule_test": silent,
		}},
	})
	out, err = promtool(t, dir, "test", "rules", "dashboard.test.yaml")
	g.Expect(err).NotTo(HaveOccurred(), "a dashboard query without data on the sharder's series (the alert's annotations name it):\n%s", out)
}
