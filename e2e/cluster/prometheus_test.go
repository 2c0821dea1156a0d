package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	promapi "github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/sharder-dev/sharder/internal/testenv"
	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// The Prometheus scenario's names: two rings of ConfigMaps whose instances
// are Leases the test holds (held for an hour: they renew nothing and
// acknowledge no drain), one naming instanceServiceAccounts and one naming
// none, as a ring of sharder agent does.
const (
	prometheusAddress    = "127.0.0.1:16590"
	alertsAckRing        = "alerts-ack"
	alertsAgentRing      = "alerts-agent"
	alertsLeaseNS        = "alerts-instances"
	alertsScraper        = "e2e-prometheus"
	alertsObjectsPerRing = 8
)

// alertFor is the `for` of the alerts that have one, shortened from the
// chart's minutes so that the scenario takes seconds.
const alertFor = "10s"

// testPrometheus: a real Prometheus (built from Go modules, make prometheus)
// scrapes the sharder's replicas as the chart's ServiceMonitor does (pods
// found through the Kubernetes API, a token bound to the metrics-reader
// ClusterRole, the namespace label of prometheus-operator's targets) and
// evaluates the chart's alerting rules, rendered with helm template as
// docs/operations.md tells users without prometheus-operator. Every dashboard
// query returns data from the live series; each alert stays silent while its
// rings are healthy and fires in the situation its runbook describes.
func testPrometheus(t *testing.T) {
	g := NewWithT(t)
	ctx := t.Context()
	dir := t.TempDir()

	By(t, "a Prometheus scrapes both replicas with a token of the metrics reader")
	token := scraperToken(ctx, t, g)
	g.Expect(os.WriteFile(filepath.Join(dir, "token"), []byte(token), 0o600)).To(Succeed())
	g.Expect(os.WriteFile(filepath.Join(dir, "rules.yaml"), renderRules(ctx, g), 0o600)).To(Succeed())
	g.Expect(os.WriteFile(filepath.Join(dir, "prometheus.yaml"), []byte(prometheusConfig(dir)), 0o600)).To(Succeed())
	prom := startPrometheus(t, dir)
	g.Eventually(func(g Gomega) {
		up := query(ctx, g, prom, fmt.Sprintf(`up{job="sharder",namespace=%q} == 1`, sharderNamespace))
		g.Expect(up).To(HaveLen(2), "both replicas scraped")
	}).WithTimeout(2 * time.Minute).WithPolling(2 * time.Second).Should(Succeed())

	By(t, "two rings of ConfigMaps, one expecting acknowledgements and one not, each with one ready instance")
	createAlertRings(ctx, t, g)
	t.Cleanup(func() { deleteAlertRings(t) })
	holdLease(ctx, g, alertsAckRing, alertsAckRing+"-0")
	holdLease(ctx, g, alertsAgentRing, alertsAgentRing+"-0")
	for _, r := range []string{alertsAckRing, alertsAgentRing} {
		createConfigMaps(ctx, g, r+"-objects", "before", alertsObjectsPerRing)
	}
	for _, r := range []string{alertsAckRing, alertsAgentRing} {
		g.Eventually(func(g Gomega) {
			g.Expect(assignedTo(ctx, g, r)).To(HaveKeyWithValue(r+"-0", alertsObjectsPerRing), "ring %s", r)
		}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
	}

	By(t, "healthy rings: no alert of theirs fires for 30 seconds of evaluations")
	healthy := `ring=~"` + strings.Join([]string{alertsAckRing, alertsAgentRing, ring}, "|") + `"`
	g.Eventually(func(g Gomega) {
		// Both new rings had their instance ready through 30 s of samples.
		const ready = `sharder_ring_instances{ring=~"alerts-.*",state="ready"}`
		g.Expect(query(ctx, g, prom, `count by (ring) (min_over_time(`+ready+`[30s]) == 1 and count_over_time(`+ready+`[30s]) >= 10)`)).
			To(HaveLen(2))
	}).WithTimeout(2 * time.Minute).WithPolling(2 * time.Second).Should(Succeed())
	g.Expect(query(ctx, g, prom, `count_over_time(ALERTS{alertstate="firing",`+healthy+`}[30s])`)).To(BeEmpty(), "alerts fired on healthy rings")
	g.Expect(query(ctx, g, prom, `count_over_time(ALERTS{alertstate="firing",alertname="SharderNoLeader"}[30s])`)).To(BeEmpty(), "SharderNoLeader fired while a replica led")

	By(t, "the chart's own ring, which has no instance at all, fires SharderNoReadyInstance")
	expectFiring(ctx, g, prom, "SharderNoReadyInstance", chartRing)

	By(t, "a second instance joins each ring and acknowledges nothing: SharderForcedMoves fires for the ring that expects acknowledgements only")
	holdLease(ctx, g, alertsAckRing, alertsAckRing+"-1")
	holdLease(ctx, g, alertsAgentRing, alertsAgentRing+"-1")
	expectFiring(ctx, g, prom, "SharderForcedMoves", alertsAckRing)
	g.Eventually(func(g Gomega) {
		forced := query(ctx, g, prom, fmt.Sprintf(`sum(increase(sharder_moves_total{ring=%q,reason="forced"}[15m])) > 0`, alertsAgentRing))
		g.Expect(forced).To(HaveLen(1), "the agent ring's moves are forced too")
	}).WithTimeout(time.Minute).WithPolling(2 * time.Second).Should(Succeed())
	// Three evaluation intervals with the agent ring's forced moves in
	// range: the alert's expression drops them, so it stays silent. (Its
	// objects are unassigned for a moment after each forced release, which
	// SharderUnassignedObjects, pending, waits out.)
	g.Consistently(func(g Gomega) {
		g.Expect(query(ctx, g, prom, fmt.Sprintf(`ALERTS{alertname="SharderForcedMoves",ring=%q}`, alertsAgentRing))).To(BeEmpty())
	}).WithTimeout(6 * time.Second).WithPolling(time.Second).Should(Succeed())

	By(t, "every query of the dashboard returns data")
	for _, q := range dashboardQueries(g) {
		g.Eventually(func(g Gomega) {
			g.Expect(query(ctx, g, prom, q)).NotTo(BeEmpty(), "no data: %s", q)
		}).WithTimeout(time.Minute).WithPolling(2 * time.Second).Should(Succeed())
	}

	By(t, "the ring's instances stop and new objects come: SharderNoReadyInstance and SharderUnassignedObjects fire")
	releaseLease(ctx, g, alertsAckRing+"-0")
	releaseLease(ctx, g, alertsAckRing+"-1")
	// The objects come once the sharder has no ready instance: created
	// before it saw the second release, they would rightly be assigned to
	// that instance, and none would be unassigned.
	expectFiring(ctx, g, prom, "SharderNoReadyInstance", alertsAckRing)
	createConfigMaps(ctx, g, alertsAckRing+"-objects", "after", 3)
	expectFiring(ctx, g, prom, "SharderUnassignedObjects", alertsAckRing)

	By(t, "no replica runs: SharderNoLeader fires, and clears once one leads again")
	scaleSharder(ctx, g, 0)
	expectFiring(ctx, g, prom, "SharderNoLeader", "")
	scaleSharder(ctx, g, 2)
	g.Eventually(func(g Gomega) {
		var dep appsv1.Deployment
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: sharderNamespace, Name: release}, &dep)).To(Succeed())
		g.Expect(dep.Status.ReadyReplicas).To(Equal(int32(2)))
	}).WithTimeout(3 * time.Minute).WithPolling(time.Second).Should(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(query(ctx, g, prom, `ALERTS{alertname="SharderNoLeader"}`)).To(BeEmpty())
	}).WithTimeout(2 * time.Minute).WithPolling(2 * time.Second).Should(Succeed())
}

// scraperToken creates the scraper's ServiceAccount, binds it to the chart's
// metrics-reader ClusterRole, and returns a token of it.
func scraperToken(ctx context.Context, t *testing.T, g Gomega) string {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: sharderNamespace, Name: alertsScraper}}
	g.Expect(k8sClient.Create(ctx, sa)).To(Succeed())
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: alertsScraper},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: release + "-metrics-reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: sharderNamespace, Name: alertsScraper}},
	}
	g.Expect(k8sClient.Create(ctx, binding)).To(Succeed())
	t.Cleanup(func() {
		ctx := context.Background()
		_ = client.IgnoreNotFound(k8sClient.Delete(ctx, binding))
		_ = client.IgnoreNotFound(k8sClient.Delete(ctx, sa))
	})
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}
	g.Expect(k8sClient.SubResource("token").Create(ctx, sa, req)).To(Succeed())
	g.Expect(req.Status.Token).NotTo(BeEmpty())
	return req.Status.Token
}

// renderRules renders the chart's PrometheusRule for this release with every
// alert's `for` shortened, and returns its spec: a Prometheus rule file.
func renderRules(ctx context.Context, g Gomega) []byte {
	args := []string{"template", release, filepath.Join(repoRoot, "charts", "sharder"), "--namespace", sharderNamespace,
		"--kube-version", testenv.KubernetesVersion, "--set", "prometheusRule.enabled=true"}
	for _, alert := range []string{"SharderUnassignedObjects", "SharderNoReadyInstance", "SharderNoLeader"} {
		args = append(args, "--set", "prometheusRule.alerts."+alert+".for="+alertFor)
	}
	out, err := helm(ctx, args...)
	g.Expect(err).NotTo(HaveOccurred())
	objs, err := testenv.DecodeObjects([]byte(out))
	g.Expect(err).NotTo(HaveOccurred())
	for _, o := range objs {
		if o.GetKind() != "PrometheusRule" {
			continue
		}
		spec, _, err := unstructured.NestedMap(o.Object, "spec")
		g.Expect(err).NotTo(HaveOccurred())
		rules, err := yaml.Marshal(spec)
		g.Expect(err).NotTo(HaveOccurred())
		return rules
	}
	g.Expect("").To(Equal("a PrometheusRule"), "helm template rendered no PrometheusRule")
	return nil
}

// prometheusConfig scrapes the metrics port of the sharder's pods, found
// through the Kubernetes API with the suite's kubeconfig, and gives each
// target the labels prometheus-operator gives a ServiceMonitor's (namespace,
// pod). The chart's default metrics certificate is self-signed at start, so
// nothing can verify it: the scrape skips verification, as a
// ServiceMonitor's tlsConfig.insecureSkipVerify does.
func prometheusConfig(dir string) string {
	return fmt.Sprintf(`global:
  scrape_interval: 2s
  evaluation_interval: 2s
rule_files: [%q]
scrape_configs:
- job_name: sharder
  scheme: https
  authorization:
    credentials_file: %q
  tls_config:
    insecure_skip_verify: true
  kubernetes_sd_configs:
  - role: pod
    kubeconfig_file: %q
    namespaces:
      names: [%q]
  relabel_configs:
  - source_labels: [__meta_kubernetes_pod_label_app_kubernetes_io_name, __meta_kubernetes_pod_container_port_name]
    regex: sharder;metrics
    action: keep
  - source_labels: [__meta_kubernetes_namespace]
    target_label: namespace
  - source_labels: [__meta_kubernetes_pod_name]
    target_label: pod
`, filepath.Join(dir, "rules.yaml"), filepath.Join(dir, "token"), kubeconfig, sharderNamespace)
}

// startPrometheus runs bin/prometheus with the configuration in dir until
// the test ends, and returns its query API once it answers.
func startPrometheus(t *testing.T, dir string) promv1.API {
	t.Helper()
	bin := filepath.Join(repoRoot, "bin", "prometheus")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("prometheus not found at %s: run `make prometheus` (make test and make e2e-cluster build it first)", bin)
	}
	logPath := filepath.Join(dir, "prometheus.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yaml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+prometheusAddress)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting prometheus: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		stopProcess(cmd.Process, done, 30*time.Second)
		_ = logFile.Close()
		if t.Failed() {
			if out, err := os.ReadFile(logPath); err == nil {
				t.Logf("prometheus log:\n%s", tail(string(out), 100))
			}
		}
	})
	c, err := promapi.NewClient(promapi.Config{Address: "http://" + prometheusAddress})
	if err != nil {
		t.Fatal(err)
	}
	api := promv1.NewAPI(c)
	NewWithT(t).Eventually(func(g Gomega) {
		select {
		case <-done:
			g.Expect("").To(BeEmpty(), "prometheus exited; its log is printed at the end")
			return
		default:
		}
		rules, err := api.Rules(t.Context(), nil)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(rules.Groups).To(HaveLen(1), "the chart's rule group is loaded")
	}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
	return api
}

// query evaluates an instant query now.
func query(ctx context.Context, g Gomega, api promv1.API, q string) model.Vector {
	v, _, err := api.Query(ctx, q, time.Now())
	g.Expect(err).NotTo(HaveOccurred(), q)
	vec, ok := v.(model.Vector)
	g.Expect(ok).To(BeTrue(), "%s: a %s, not a vector", q, v.Type())
	return vec
}

// expectFiring waits for an alert to fire, for a ring unless ring is empty.
func expectFiring(ctx context.Context, g Gomega, api promv1.API, alert, ring string) {
	selector := fmt.Sprintf(`alertname=%q,alertstate="firing",namespace=%q`, alert, sharderNamespace)
	if ring != "" {
		selector += fmt.Sprintf(",ring=%q", ring)
	}
	g.Eventually(func(g Gomega) {
		g.Expect(query(ctx, g, api, "ALERTS{"+selector+"}")).To(HaveLen(1), "%s fires", alert)
	}).WithTimeout(2*time.Minute).WithPolling(2*time.Second).Should(Succeed(), "ring %q", ring)
}

// dashboardQueries returns every query of the chart's dashboard, with its
// variables set as Grafana sets them: the ring of forced moves, and a rate
// interval that spans the scenario.
func dashboardQueries(g Gomega) []string {
	raw, err := os.ReadFile(filepath.Join(repoRoot, "charts", "sharder", "dashboards", "rings.json"))
	g.Expect(err).NotTo(HaveOccurred())
	var dashboard struct {
		Panels []struct {
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	g.Expect(json.Unmarshal(raw, &dashboard)).To(Succeed())
	vars := strings.NewReplacer("$ring", alertsAckRing, "$__rate_interval", "5m")
	var queries []string
	for _, p := range dashboard.Panels {
		for _, target := range p.Targets {
			if target.Expr != "" {
				queries = append(queries, vars.Replace(target.Expr))
			}
		}
	}
	for _, v := range dashboard.Templating.List {
		// label_values(METRIC, LABEL) is Grafana's: the series must exist.
		if metric, ok := strings.CutPrefix(v.Definition, "label_values("); ok {
			metric, _, _ = strings.Cut(metric, ",")
			queries = append(queries, metric)
		}
	}
	g.Expect(queries).NotTo(BeEmpty())
	return queries
}

// createAlertRings creates the scenario's two rings, their objects'
// namespaces and the namespace of their Leases.
func createAlertRings(ctx context.Context, t *testing.T, g Gomega) {
	g.Expect(k8sClient.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: alertsLeaseNS}})).To(Succeed())
	for _, r := range []string{alertsAckRing, alertsAgentRing} {
		g.Expect(k8sClient.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
			Name: r + "-objects", Labels: map[string]string{"sharder.dev/e2e": r},
		}})).To(Succeed())
		cr := &sharderv1alpha1.ControllerRing{
			ObjectMeta: metav1.ObjectMeta{Name: r},
			Spec: sharderv1alpha1.ControllerRingSpec{
				LeaseNamespace:    alertsLeaseNS,
				Resources:         []sharderv1alpha1.RingResource{{Group: "", Resource: "configmaps"}},
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"sharder.dev/e2e": r}},
				DrainTimeout:      &metav1.Duration{Duration: 2 * time.Second},
			},
		}
		if r == alertsAckRing {
			cr.Spec.InstanceServiceAccounts = []sharderv1alpha1.ServiceAccountReference{{Namespace: alertsLeaseNS, Name: "default"}}
		}
		g.Expect(k8sClient.Create(ctx, cr)).To(Succeed())
	}
	t.Logf("rings %s and %s created", alertsAckRing, alertsAgentRing)
}

// deleteAlertRings deletes the scenario's rings (their finalizer removes
// their labels first) and namespaces, and waits until the rings are gone.
func deleteAlertRings(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	g := NewWithT(t)
	for _, r := range []string{alertsAckRing, alertsAgentRing} {
		_ = client.IgnoreNotFound(k8sClient.Delete(ctx, &sharderv1alpha1.ControllerRing{ObjectMeta: metav1.ObjectMeta{Name: r}}))
	}
	g.Eventually(func(g Gomega) {
		for _, r := range []string{alertsAckRing, alertsAgentRing} {
			err := k8sClient.Get(ctx, client.ObjectKey{Name: r}, &sharderv1alpha1.ControllerRing{})
			g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "ring %s is gone: %v", r, err)
		}
	}).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
	for _, ns := range []string{alertsLeaseNS, alertsAckRing + "-objects", alertsAgentRing + "-objects"} {
		_ = client.IgnoreNotFound(k8sClient.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	}
}

// holdLease creates an instance's Lease of a ring, held for an hour: ready
// without renewals.
func holdLease(ctx context.Context, g Gomega, ring, id string) {
	g.Expect(k8sClient.Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: alertsLeaseNS, Name: id, Labels: map[string]string{sharderv1alpha1.LabelRing: ring}},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       ptr.To(id),
			LeaseDurationSeconds: ptr.To[int32](3600),
			RenewTime:            &metav1.MicroTime{Time: time.Now()},
		},
	})).To(Succeed())
}

// releaseLease hands an instance's Lease back, as a stopping instance does.
func releaseLease(ctx context.Context, g Gomega, id string) {
	g.Eventually(func() error {
		var lease coordinationv1.Lease
		if err := k8sClient.Get(ctx, client.ObjectKey{Namespace: alertsLeaseNS, Name: id}, &lease); err != nil {
			return err
		}
		lease.Spec.HolderIdentity = nil
		return k8sClient.Update(ctx, &lease)
	}).WithTimeout(30 * time.Second).Should(Succeed())
}

// createConfigMaps creates n ConfigMaps named prefix-i in a namespace.
func createConfigMaps(ctx context.Context, g Gomega, namespace, prefix string, n int) {
	for i := range n {
		g.Expect(k8sClient.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
			Namespace: namespace, Name: fmt.Sprintf("%s-%d", prefix, i),
		}})).To(Succeed())
	}
}

// assignedTo counts a ring's ConfigMaps per instance of its shard label.
func assignedTo(ctx context.Context, g Gomega, ring string) map[string]int {
	var list corev1.ConfigMapList
	g.Expect(k8sClient.List(ctx, &list, client.InNamespace(ring+"-objects"))).To(Succeed())
	counts := map[string]int{}
	for _, cm := range list.Items {
		if cm.Name == "kube-root-ca.crt" {
			continue
		}
		counts[cm.Labels[sharderv1alpha1.ShardLabel(ring)]]++
	}
	return counts
}

// scaleSharder sets the replicas of the sharder's Deployment.
func scaleSharder(ctx context.Context, g Gomega, n int32) {
	g.Eventually(func() error {
		var dep appsv1.Deployment
		if err := k8sClient.Get(ctx, client.ObjectKey{Namespace: sharderNamespace, Name: release}, &dep); err != nil {
			return err
		}
		dep.Spec.Replicas = ptr.To(n)
		return k8sClient.Update(ctx, &dep)
	}).WithTimeout(30 * time.Second).Should(Succeed())
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
