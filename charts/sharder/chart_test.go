// Package chart_test checks the Helm chart: it lints, renders what each
// value promises, stays in line with the generated RBAC and CRDs, and what
// it renders is accepted by a real API server (server-side dry-run).
package chart_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/sharder-dev/sharder/internal/testenv"
	"github.com/sharder-dev/sharder/pkg/sharder/config"
)

const (
	release   = "sharder"
	namespace = "sharder-system"
	// kubeVersion is the version helm template assumes (the chart needs
	// 1.30+ for the webhook's matchConditions).
	kubeVersion = "1.36.0"
)

var suite testenv.Suite // the control plane, started for the first test that calls env

func env() *testenv.Env { return suite.Env() }

func TestMain(m *testing.M) {
	os.Exit(testenv.Run(m, &suite, testenv.Options{CRDDirectoryPaths: []string{"config/crd/bases"}}))
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// helm runs bin/helm with args in the chart folder.
func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	bin := filepath.Join(repoRoot(t), "bin", "helm")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("helm not found at %s: run `make tools` (make test installs it first)", bin)
	}
	cmd := exec.Command(bin, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// render runs helm template with the values (YAML) and returns the
// manifests and their objects.
func render(t *testing.T, values string) (string, []*unstructured.Unstructured) {
	t.Helper()
	out, err := renderErr(t, values)
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	objs, err := testenv.DecodeObjects([]byte(out))
	if err != nil {
		t.Fatalf("decoding the rendered chart: %v", err)
	}
	return out, objs
}

func renderErr(t *testing.T, values string) (string, error) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(file, []byte(values), 0o600); err != nil {
		t.Fatal(err)
	}
	return helm(t, "template", release, ".", "--namespace", namespace, "--kube-version", kubeVersion, "--values", file)
}

// find returns the objects of kind, by name.
func find(objs []*unstructured.Unstructured, kind string) map[string]*unstructured.Unstructured {
	found := map[string]*unstructured.Unstructured{}
	for _, o := range objs {
		if o.GetKind() == kind {
			found[o.GetName()] = o
		}
	}
	return found
}

// as converts an object to a typed one, strictly.
func as[T any](t *testing.T, o *unstructured.Unstructured) *T {
	t.Helper()
	if o == nil {
		t.Fatal("object not rendered")
	}
	data, err := json.Marshal(o.Object)
	if err != nil {
		t.Fatal(err)
	}
	v := new(T)
	if err := yaml.UnmarshalStrict(data, v); err != nil {
		t.Fatalf("%s %s: %v", o.GetKind(), o.GetName(), err)
	}
	return v
}

// sharderConfig returns the configuration file the chart renders, loaded
// and validated as `sharder run` does.
func sharderConfig(t *testing.T, objs []*unstructured.Unstructured) *config.Config {
	t.Helper()
	cm := as[corev1.ConfigMap](t, find(objs, "ConfigMap")["sharder-config"])
	cfg := config.Default()
	if err := config.Load([]byte(cm.Data["config.yaml"]), cfg); err != nil {
		t.Fatalf("the rendered configuration file does not load: %v\n%s", err, cm.Data["config.yaml"])
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("the rendered configuration file is invalid: %v", err)
	}
	return cfg
}

const allFeatures = `
webhook:
  certificates:
    mode: cert-manager
metrics:
  certSecret: sharder-metrics-tls
  serviceMonitor:
    enabled: true
prometheusRule:
  enabled: true
dashboards:
  enabled: true
pprof:
  enabled: true
startupProbe:
  enabled: true
hostNetwork: true
env:
  GOMEMLIMIT: 450MiB
extraVolumes:
- {name: ca, configMap: {name: trusted-ca}}
extraVolumeMounts:
- {name: ca, mountPath: /etc/ssl/certs/extra, readOnly: true}
rings:
- name: example
  spec:
    leaseNamespace: example-system
    resources:
    - {group: example.dev, resource: widgets}
`

func TestLint(t *testing.T) {
	t.Parallel()
	for name, values := range map[string]string{"defaults": "", "all features": allFeatures} {
		t.Run(name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "values.yaml")
			if err := os.WriteFile(file, []byte(values), 0o600); err != nil {
				t.Fatal(err)
			}
			out, err := helm(t, "lint", ".", "--strict", "--kube-version", kubeVersion, "--values", file)
			if err != nil {
				t.Fatalf("helm lint: %v\n%s", err, out)
			}
		})
	}
}

func TestRenderDefaults(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	_, objs := render(t, "")

	dep := as[appsv1.Deployment](t, find(objs, "Deployment")["sharder"])
	g.Expect(dep.Spec.Replicas).To(HaveValue(BeEquivalentTo(2)))
	pod := dep.Spec.Template.Spec
	g.Expect(pod.SecurityContext.RunAsNonRoot).To(HaveValue(BeTrue()))
	g.Expect(pod.TopologySpreadConstraints).To(HaveLen(2))
	c := pod.Containers[0]
	g.Expect(c.Image).To(Equal("ghcr.io/sharder-dev/sharder:0.1.0"), "default tag: the appVersion")
	g.Expect(c.SecurityContext.ReadOnlyRootFilesystem).To(HaveValue(BeTrue()))
	g.Expect(c.ReadinessProbe.HTTPGet.Path).To(Equal("/readyz"))
	g.Expect(c.Args).To(Equal([]string{"run", "--config=/etc/sharder/config.yaml"}))
	g.Expect(dep.Spec.Template.Annotations).To(HaveKey("checksum/config"))

	cfg := sharderConfig(t, objs)
	g.Expect(cfg.Webhook.CertMode).To(Equal(config.CertModeSelfManaged))
	g.Expect(cfg.Webhook.ServiceName).To(Equal("sharder-webhook"))
	g.Expect(cfg.Metrics.Secure).To(BeTrue())
	g.Expect(cfg.Pprof.BindAddress).To(Equal("0"), "pprof is opt-in")
	g.Expect(cfg.LeaderElection.LeaseName).To(Equal("sharder"))
	// The install's ClusterRole owns the webhook configuration, and the
	// sharder may read that ClusterRole only.
	g.Expect(cfg.Webhook.OwnerClusterRole).To(Equal("sharder"))
	clusterRole := as[rbacv1.ClusterRole](t, find(objs, "ClusterRole")["sharder"])
	g.Expect(clusterRole.Rules).To(ContainElement(rbacv1.PolicyRule{APIGroups: []string{"rbac.authorization.k8s.io"},
		Resources: []string{"clusterroles"}, ResourceNames: []string{"sharder"}, Verbs: []string{"get"}}))
	g.Expect(pod.TerminationGracePeriodSeconds).To(HaveValue(BeNumerically(">", cfg.ShutdownTimeout.Seconds())),
		"terminationGracePeriodSeconds must exceed shutdownTimeout")

	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	g.Expect(ports).To(Equal(map[string]int32{"webhook": int32(cfg.Webhook.Port), "metrics": 8443, "health": 8081}))

	// The certificate Secret: read and update by name only.
	role := as[rbacv1.Role](t, find(objs, "Role")["sharder-webhook-certificate"])
	for _, rule := range role.Rules {
		if slices.Contains(rule.Verbs, "get") || slices.Contains(rule.Verbs, "update") {
			g.Expect(rule.ResourceNames).To(Equal([]string{cfg.Webhook.SecretName}))
		}
		g.Expect(rule.Verbs).NotTo(ContainElements("list", "watch", "delete"))
	}

	svc := as[corev1.Service](t, find(objs, "Service")["sharder-webhook"])
	g.Expect(svc.Spec.Ports[0].Port).To(BeEquivalentTo(cfg.Webhook.ServicePort))
	g.Expect(svc.Spec.Selector).To(Equal(dep.Spec.Selector.MatchLabels))
	g.Expect(find(objs, "PodDisruptionBudget")).To(HaveKey("sharder"))
	for _, kind := range []string{"ServiceMonitor", "Certificate", "Issuer", "ControllerRing"} {
		g.Expect(find(objs, kind)).To(BeEmpty(), kind)
	}
	g.Expect(find(objs, "ConfigMap")).NotTo(HaveKey("sharder-dashboard"))
}

func TestRenderCertManager(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	_, objs := render(t, "webhook:\n  certificates:\n    mode: cert-manager\n")
	cfg := sharderConfig(t, objs)
	g.Expect(cfg.Webhook.CertMode).To(Equal(config.CertModeExternal))
	g.Expect(cfg.Webhook.CAInjectFrom).To(Equal(namespace + "/sharder-webhook"))

	cert := find(objs, "Certificate")["sharder-webhook"]
	g.Expect(cert).NotTo(BeNil())
	dnsNames, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
	g.Expect(dnsNames).To(ContainElement("sharder-webhook." + namespace + ".svc"))
	secretName, _, _ := unstructured.NestedString(cert.Object, "spec", "secretName")
	issuer, _, _ := unstructured.NestedString(cert.Object, "spec", "issuerRef", "name")
	g.Expect(find(objs, "Issuer")).To(HaveKey(issuer), "a self-signed Issuer unless one is given")

	dep := as[appsv1.Deployment](t, find(objs, "Deployment")["sharder"])
	var mounted bool
	for _, v := range dep.Spec.Template.Spec.Volumes {
		if v.Secret != nil && v.Secret.SecretName == secretName {
			for _, m := range dep.Spec.Template.Spec.Containers[0].VolumeMounts {
				mounted = mounted || (m.Name == v.Name && m.MountPath == cfg.Webhook.CertDir)
			}
		}
	}
	g.Expect(mounted).To(BeTrue(), "the certificate Secret is mounted at webhook.certDir")
	g.Expect(find(objs, "Role")).NotTo(HaveKey("sharder-webhook-certificate"), "no Secret access needed")

	_, objs = render(t, "webhook:\n  certificates:\n    mode: cert-manager\n    certManager:\n      issuerRef: {kind: ClusterIssuer, name: internal-ca}\n")
	g.Expect(find(objs, "Issuer")).To(BeEmpty())
	kind, _, _ := unstructured.NestedString(find(objs, "Certificate")["sharder-webhook"].Object, "spec", "issuerRef", "kind")
	g.Expect(kind).To(Equal("ClusterIssuer"))
}

func TestRenderServiceMonitor(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	_, objs := render(t, "metrics:\n  certSecret: sharder-metrics-tls\n  serviceMonitor:\n    enabled: true\n    labels: {release: prometheus}\n")
	sm := find(objs, "ServiceMonitor")["sharder"]
	g.Expect(sm).NotTo(BeNil())
	g.Expect(sm.GetLabels()).To(HaveKeyWithValue("release", "prometheus"))
	endpoints, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	g.Expect(endpoints).To(HaveLen(1))
	ep := endpoints[0].(map[string]any)
	g.Expect(ep).To(HaveKeyWithValue("scheme", "https"))
	g.Expect(ep).To(HaveKeyWithValue("port", "metrics"))
	g.Expect(ep).NotTo(HaveKey("honorLabels"), "no sharder metric carries a target label")
	g.Expect(ep).NotTo(HaveKey("bearerTokenFile"), "deprecated by prometheus-operator")
	g.Expect(ep).To(HaveKeyWithValue("authorization", map[string]any{
		"type": "Bearer", "credentials": map[string]any{"name": "sharder-metrics-scraper-token", "key": "token"},
	}))
	g.Expect(ep).To(HaveKeyWithValue("tlsConfig", map[string]any{
		"serverName":         "sharder-metrics." + namespace + ".svc",
		"ca":                 map[string]any{"secret": map[string]any{"name": "sharder-metrics-tls", "key": "ca.crt"}},
		"insecureSkipVerify": false,
	}))

	// The metrics certificate is mounted and named in the configuration.
	cfg := sharderConfig(t, objs)
	dep := as[appsv1.Deployment](t, find(objs, "Deployment")["sharder"])
	g.Expect(dep.Spec.Template.Spec.Volumes).To(ContainElement(corev1.Volume{Name: "metrics-certs",
		VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "sharder-metrics-tls"}}}))
	g.Expect(dep.Spec.Template.Spec.Containers[0].VolumeMounts).To(ContainElement(corev1.VolumeMount{Name: "metrics-certs",
		MountPath: cfg.Metrics.CertDir, ReadOnly: true}))

	// The scraping identity: a ServiceAccount, its token, and the right to
	// get /metrics.
	token := as[corev1.Secret](t, find(objs, "Secret")["sharder-metrics-scraper-token"])
	g.Expect(token.Type).To(Equal(corev1.SecretTypeServiceAccountToken))
	g.Expect(token.Annotations).To(HaveKeyWithValue(corev1.ServiceAccountNameKey, "sharder-metrics-scraper"))
	g.Expect(find(objs, "ServiceAccount")).To(HaveKey("sharder-metrics-scraper"))
	binding := as[rbacv1.ClusterRoleBinding](t, find(objs, "ClusterRoleBinding")["sharder-metrics-scraper"])
	g.Expect(binding.RoleRef.Name).To(Equal("sharder-metrics-reader"))
	g.Expect(binding.Subjects).To(Equal([]rbacv1.Subject{{Kind: "ServiceAccount", Name: "sharder-metrics-scraper", Namespace: namespace}}))

	// A token and CA of one's own, and no scraping identity from the chart.
	_, objs = render(t, `
metrics:
  serviceMonitor:
    enabled: true
    authorization:
      credentials: {name: prometheus-token, key: jwt}
    tlsConfig:
      ca: {configMap: {name: metrics-ca, key: ca.crt}}
      serverName: sharder.example
`)
	endpoints, _, _ = unstructured.NestedSlice(find(objs, "ServiceMonitor")["sharder"].Object, "spec", "endpoints")
	ep = endpoints[0].(map[string]any)
	g.Expect(ep).To(HaveKeyWithValue("authorization", map[string]any{
		"type": "Bearer", "credentials": map[string]any{"name": "prometheus-token", "key": "jwt"},
	}))
	g.Expect(ep).To(HaveKeyWithValue("tlsConfig", map[string]any{
		"serverName":         "sharder.example",
		"ca":                 map[string]any{"configMap": map[string]any{"name": "metrics-ca", "key": "ca.crt"}},
		"insecureSkipVerify": false,
	}))
	g.Expect(find(objs, "Secret")).To(BeEmpty())
	g.Expect(find(objs, "ServiceAccount")).NotTo(HaveKey("sharder-metrics-scraper"))
	g.Expect(find(objs, "ClusterRoleBinding")).NotTo(HaveKey("sharder-metrics-scraper"))
	g.Expect(sharderConfig(t, objs).Metrics.CertDir).To(BeEmpty(), "no metrics.certSecret: a self-signed certificate")

	// Its selector finds the metrics Service.
	selector, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
	svc := find(objs, "Service")["sharder-metrics"]
	g.Expect(svc).NotTo(BeNil())
	for k, v := range selector {
		g.Expect(svc.GetLabels()).To(HaveKeyWithValue(k, v))
	}
	g.Expect(find(objs, "ClusterRole")).To(HaveKey("sharder-metrics-reader"))
}

// metricNamesRE finds the metric names in pkg/sharder/metrics.
var metricNamesRE = regexp.MustCompile(`Name:\s+"(sharder_[a-z_]+)"`)

func TestRenderDashboard(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	_, objs := render(t, "dashboards:\n  enabled: true\n  namespace: monitoring\n")
	cm := as[corev1.ConfigMap](t, find(objs, "ConfigMap")["sharder-dashboard"])
	g.Expect(cm.Namespace).To(Equal("monitoring"))
	g.Expect(cm.Labels).To(HaveKeyWithValue("grafana_dashboard", "1"))

	var dash struct {
		Title  string `json:"title"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	g.Expect(json.Unmarshal([]byte(cm.Data["sharder-rings.json"]), &dash)).To(Succeed())

	// Every metric the dashboard queries is defined in pkg/sharder/metrics.
	defined := map[string]bool{}
	files, err := filepath.Glob(filepath.Join(repoRoot(t), "pkg", "sharder", "metrics", "*.go"))
	g.Expect(err).NotTo(HaveOccurred())
	for _, f := range files {
		data, err := os.ReadFile(f)
		g.Expect(err).NotTo(HaveOccurred())
		for _, m := range metricNamesRE.FindAllStringSubmatch(string(data), -1) {
			defined[m[1]] = true
		}
	}
	used := regexp.MustCompile(`sharder_[a-z_]+`)
	titles := []string{}
	for _, p := range dash.Panels {
		titles = append(titles, p.Title)
		g.Expect(p.Targets).NotTo(BeEmpty(), p.Title)
		for _, target := range p.Targets {
			for _, name := range used.FindAllString(target.Expr, -1) {
				base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")
				g.Expect(defined).To(HaveKey(base), "panel %q queries %s", p.Title, name)
			}
		}
	}
	// The ring view the chart promises.
	g.Expect(titles).To(ContainElements("Instances by state", "Objects per instance", "Moves by reason",
		"Drain duration", "Assignment latency"))
}

func TestRenderRings(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	_, objs := render(t, `
rings:
- name: etcd-operator
  spec:
    leaseNamespace: etcd-operator-system
    resources:
    - group: etcd.example.sharder.dev
      resource: etcdclusters
      controlledResources:
      - {group: apps, resource: statefulsets}
      - {group: "", resource: services}
    - group: ""
      resource: configmaps
- name: unmanaged
  rbac: false
  spec:
    leaseNamespace: other
    resources:
    - {resource: secrets}
`)
	rings := find(objs, "ControllerRing")
	g.Expect(rings).To(HaveLen(2))
	lease, _, _ := unstructured.NestedString(rings["etcd-operator"].Object, "spec", "leaseNamespace")
	g.Expect(lease).To(Equal("etcd-operator-system"))

	role := as[rbacv1.ClusterRole](t, find(objs, "ClusterRole")["sharder:ring:etcd-operator"])
	granted := map[string][]string{}
	for _, r := range role.Rules {
		for _, group := range r.APIGroups {
			for _, res := range r.Resources {
				granted[group+"/"+res] = r.Verbs
			}
		}
	}
	verbs := []string{"get", "list", "watch", "patch"}
	g.Expect(granted).To(Equal(map[string][]string{
		"etcd.example.sharder.dev/etcdclusters": verbs,
		"apps/statefulsets":                     verbs,
		"/services":                             verbs,
		"/configmaps":                           verbs,
	}))
	g.Expect(role.Labels).To(HaveKeyWithValue("sharder.dev/aggregate-to-sharder", "true"), "aggregated into the sharder's rings role")
	g.Expect(find(objs, "ClusterRoleBinding")).NotTo(HaveKey("sharder:ring:etcd-operator"), "the rings role is bound once, not per ring")
	ringsRole := as[rbacv1.ClusterRole](t, find(objs, "ClusterRole")["sharder-rings"])
	g.Expect(ringsRole.AggregationRule).To(Equal(&rbacv1.AggregationRule{ClusterRoleSelectors: []metav1.LabelSelector{
		{MatchLabels: map[string]string{"sharder.dev/aggregate-to-sharder": "true"}},
	}}))
	binding := as[rbacv1.ClusterRoleBinding](t, find(objs, "ClusterRoleBinding")["sharder-rings"])
	g.Expect(binding.RoleRef.Name).To(Equal("sharder-rings"))
	g.Expect(binding.Subjects).To(Equal([]rbacv1.Subject{{Kind: "ServiceAccount", Name: "sharder", Namespace: namespace}}))
	g.Expect(find(objs, "ClusterRole")).NotTo(HaveKey("sharder:ring:unmanaged"), "rbac: false")
}

func TestRenderRejectsBadValues(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct{ values, want string }{
		"ring without name":          {"rings:\n- spec: {leaseNamespace: x}\n", "every entry needs a name"},
		"ring without spec":          {"rings:\n- name: r\n", "rings[r]: spec is required"},
		"foreign service account":    {"serviceAccount:\n  create: false\n", "serviceAccount.name is required"},
		"plain metrics scraped":      {"metrics:\n  secure: false\n  serviceMonitor:\n    enabled: true\n", "metrics.serviceMonitor needs metrics.secure: true"},
		"unverifiable metrics":       {"metrics:\n  serviceMonitor:\n    enabled: true\n", "Prometheus cannot verify the self-signed metrics certificate"},
		"webhook on the health port": {"webhook:\n  port: 8081\n", "health.port and webhook.port are both 8081"},
		"pprof on the metrics port":  {"pprof:\n  enabled: true\n  port: 8443\n", "metrics.port and pprof.port are both 8443"},
	} {
		t.Run(name, func(t *testing.T) {
			out, err := renderErr(t, tc.values)
			if err == nil {
				t.Fatalf("helm template succeeded; want an error containing %q", tc.want)
			}
			if !strings.Contains(out, tc.want) {
				t.Fatalf("helm template error does not name the problem %q:\n%s", tc.want, out)
			}
		})
	}
}

// TestClusterRoleMatchesGenerated keeps the chart's ClusterRole in line
// with config/rbac/role.yaml, generated from the code's RBAC markers.
func TestClusterRoleMatchesGenerated(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	data, err := os.ReadFile(filepath.Join(repoRoot(t), "config", "rbac", "role.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	var generated *rbacv1.ClusterRole
	roles, err := testenv.DecodeObjects(data)
	g.Expect(err).NotTo(HaveOccurred())
	for _, u := range roles {
		if u.GetKind() == "ClusterRole" {
			generated = as[rbacv1.ClusterRole](t, u)
		}
	}
	g.Expect(generated).NotTo(BeNil())
	_, objs := render(t, "")
	chart := as[rbacv1.ClusterRole](t, find(objs, "ClusterRole")["sharder"])
	g.Expect(permissions(chart.Rules)).To(Equal(permissions(generated.Rules)),
		"charts/sharder/templates/rbac.yaml differs from config/rbac/role.yaml (generated by `make generate`): update the chart's ClusterRole")
}

// permissions flattens rules into sorted "group/resource:verb" entries.
func permissions(rules []rbacv1.PolicyRule) []string {
	var out []string
	for _, r := range rules {
		for _, group := range r.APIGroups {
			for _, res := range r.Resources {
				for _, verb := range r.Verbs {
					out = append(out, group+"/"+res+":"+verb)
				}
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func TestCRDsMatchConfig(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	root := repoRoot(t)
	sources, err := filepath.Glob(filepath.Join(root, "config", "crd", "bases", "*.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	copies, err := filepath.Glob("crds/*.yaml")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(len(copies)).To(Equal(len(sources)), "run `make chart-crds`")
	for _, src := range sources {
		want, err := os.ReadFile(src)
		g.Expect(err).NotTo(HaveOccurred())
		got, err := os.ReadFile(filepath.Join("crds", filepath.Base(src)))
		g.Expect(err).NotTo(HaveOccurred(), "run `make chart-crds`")
		g.Expect(string(got)).To(Equal(string(want)), "charts/sharder/crds/%s is stale: run `make chart-crds`", filepath.Base(src))
	}
}

// TestDryRun applies the rendered chart (with rings, the dashboard and the
// pod options; the ServiceMonitor and cert-manager CRDs do not exist on the
// local API server)
// with a server-side dry-run: the API server validates every object.
func TestDryRun(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	err := env().Client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	manifests, objs := render(t, `
dashboards:
  enabled: true
pprof:
  enabled: true
hostNetwork: true
startupProbe:
  enabled: true
readinessProbe:
  timeoutSeconds: 2
env:
  GOMEMLIMIT: 450MiB
extraEnv:
- name: GOMAXPROCS
  valueFrom:
    resourceFieldRef: {resource: limits.cpu}
extraVolumes:
- {name: ca, configMap: {name: trusted-ca}}
extraVolumeMounts:
- {name: ca, mountPath: /etc/ssl/certs/extra, readOnly: true}
rings:
- name: example
  spec:
    leaseNamespace: example-system
    resources:
    - group: example.dev
      resource: widgets
      controlledResources:
      - {group: apps, resource: deployments}
    drainTimeout: 45s
`)
	g.Expect(len(objs)).To(BeNumerically(">=", 15))

	out := env().Kubectl(t, []byte(manifests), "apply", "--server-side", "--dry-run=server", "--field-manager=helm-test", "-f", "-")
	g.Expect(string(out)).To(ContainSubstring("deployment.apps/sharder serverside-applied (server dry run)"))
	g.Expect(string(out)).To(ContainSubstring("controllerring.sharder.dev/example serverside-applied (server dry run)"))
	g.Expect(strings.Count(string(out), "(server dry run)")).To(Equal(len(objs)))
}

// TestRenderUninstallHook checks the pre-delete hook that deletes the rings
// declared in the values while the sharder still runs: one container per
// ring running `sharder uninstall`, with permissions for those rings only.
func TestRenderUninstallHook(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	rings := `
rings:
- name: etcd-operator
  spec:
    leaseNamespace: etcd-operator-system
    resources:
    - group: etcd.example.sharder.dev
      resource: etcdclusters
      controlledResources:
      - {group: apps, resource: statefulsets}
- name: plain
  spec:
    leaseNamespace: plain-system
    resources:
    - {resource: configmaps}
`
	_, objs := render(t, rings)
	job := as[batchv1.Job](t, find(objs, "Job")["sharder-uninstall"])
	g.Expect(job.Annotations).To(HaveKeyWithValue("helm.sh/hook", "pre-delete"))
	g.Expect(job.Spec.Template.Spec.ServiceAccountName).To(Equal("sharder-uninstall"))
	containers := job.Spec.Template.Spec.Containers
	g.Expect(containers).To(HaveLen(2))
	g.Expect(containers[0].Args).To(Equal([]string{"uninstall", "etcd-operator", "--webhook-configuration-name=sharder", "--sharder-wait=2m"}))
	g.Expect(containers[1].Args).To(HaveExactElements("uninstall", "plain", Not(BeEmpty()), Not(BeEmpty())))

	role := as[rbacv1.ClusterRole](t, find(objs, "ClusterRole")["sharder-uninstall"])
	g.Expect(role.Annotations).To(HaveKeyWithValue("helm.sh/hook", "pre-delete"))
	granted := map[string][]string{}
	for _, r := range role.Rules {
		for _, group := range r.APIGroups {
			for _, res := range r.Resources {
				granted[group+"/"+res] = append(r.Verbs, r.ResourceNames...)
			}
		}
	}
	g.Expect(granted).To(Equal(map[string][]string{
		"sharder.dev/controllerrings":                                  {"get", "delete", "patch", "update", "etcd-operator", "plain"},
		"admissionregistration.k8s.io/mutatingwebhookconfigurations":   {"get", "delete", "update", "sharder"},
		"admissionregistration.k8s.io/validatingwebhookconfigurations": {"get", "delete", "update", "sharder"},
		"etcd.example.sharder.dev/etcdclusters":                        {"list", "patch"},
		"apps/statefulsets":                                            {"list", "patch"},
		"/configmaps":                                                  {"list", "patch"},
	}))
	binding := as[rbacv1.ClusterRoleBinding](t, find(objs, "ClusterRoleBinding")["sharder-uninstall"])
	g.Expect(binding.Subjects).To(Equal([]rbacv1.Subject{{Kind: "ServiceAccount", Name: "sharder-uninstall", Namespace: namespace}}))

	_, objs = render(t, "")
	g.Expect(find(objs, "Job")).To(BeEmpty(), "no rings, no hook")
	_, objs = render(t, rings+"uninstallHook:\n  enabled: false\n")
	g.Expect(find(objs, "Job")).To(BeEmpty(), "turned off")
}

// TestSlotPolicyMatchesConfig: the chart's policy guarding the slot label is
// config/policy's.
func TestSlotPolicyMatchesConfig(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	data, err := os.ReadFile(filepath.Join(repoRoot(t), "config", "policy", "slot_label_policy.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	objs, err := testenv.DecodeObjects(data)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(objs).To(HaveLen(1))
	want := as[admissionregistrationv1.ValidatingAdmissionPolicy](t, objs[0])
	_, rendered := render(t, "")
	got := as[admissionregistrationv1.ValidatingAdmissionPolicy](t, find(rendered, "ValidatingAdmissionPolicy")[want.Name])
	g.Expect(got.Spec).To(Equal(want.Spec), "charts/sharder/templates/slotpolicy.yaml differs from config/policy/slot_label_policy.yaml")
}
