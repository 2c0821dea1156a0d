package app

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/cert"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crconfig "sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/sharder-dev/sharder/internal/fixture"
	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/sharder/config"
	smetrics "github.com/sharder-dev/sharder/pkg/sharder/metrics"
	"github.com/sharder-dev/sharder/pkg/sharder/slotpolicy"
	"github.com/sharder-dev/sharder/pkg/sharder/webhook"
	"github.com/sharder-dev/sharder/pkg/slots"
)

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("finding a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// kubeconfig writes the admin kubeconfig of the test control plane.
func kubeconfig(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := env().WriteKubeConfig(path); err != nil {
		t.Fatalf("writing kubeconfig: %v", err)
	}
	return path
}

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// startRun runs `sharder run args...` until the test ends (or stop is
// called) and returns a function that stops it and returns its error.
func startRun(t *testing.T, args ...string) (stop func() error, logs *syncBuffer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	// Each run registers the sharder's controllers again in this process.
	create := func(cfg *rest.Config, opts manager.Options) (manager.Manager, error) {
		opts.Controller = crconfig.Controller{SkipNameValidation: ptr.To(true)}
		return ctrl.NewManager(cfg, opts)
	}
	cmd := newRunCommand(&runOptions{cfg: config.Default(), newManager: create})
	logs = &syncBuffer{}
	cmd.SetErr(logs)
	cmd.SetOut(io.Discard)
	cmd.SetArgs(args)
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(60 * time.Second):
				err = fmt.Errorf("sharder run did not stop within 60s")
			}
		})
		return err
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("sharder run: %v", err)
		}
		if t.Failed() {
			t.Logf("sharder run logs:\n%s", logs.String())
		}
	})
	return stop, logs
}

func httpGet(url, token string) (int, string, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, // self-signed test endpoints
	}}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

func TestRunFlagsOverrideConfigFile(t *testing.T) {
	g := NewWithT(t)
	path := filepath.Join(t.TempDir(), "config.yaml")
	g.Expect(os.WriteFile(path, []byte(`
leaderElection:
  namespace: from-file
  leaseDuration: 40s
  renewDeadline: 30s
client:
  qps: 50
logging:
  level: debug
`), 0o600)).To(Succeed())

	o := &runOptions{cfg: config.Default()}
	cmd := newRunCommand(o)
	g.Expect(cmd.Flags().Parse([]string{
		"--kubeconfig", kubeconfig(t),
		"--config", path,
		"--kube-api-qps", "75",
		"--leader-election-lease-duration", "50s",
		"--webhook-service-namespace", "hooks",
	})).To(Succeed())
	g.Expect(o.complete(cmd.Flags())).To(Succeed())

	g.Expect(o.cfg.Client.QPS).To(BeNumerically("==", 75), "flag wins over file")
	g.Expect(o.cfg.LeaderElection.LeaseDuration.Duration).To(Equal(50*time.Second), "flag wins over file")
	g.Expect(o.cfg.LeaderElection.RenewDeadline.Duration).To(Equal(30*time.Second), "file wins over default")
	g.Expect(o.cfg.LeaderElection.Namespace).To(Equal("from-file"))
	g.Expect(o.cfg.Logging.Level).To(Equal("debug"))
	g.Expect(o.cfg.Client.Burst).To(Equal(config.Default().Client.Burst), "default kept")
	g.Expect(o.cfg.Webhook.ServiceNamespace).To(Equal("hooks"))
	g.Expect(o.namespace).To(Equal("default"), "the kubeconfig context's namespace")
}

func TestRunNamespaceDefaultsToPodNamespace(t *testing.T) {
	g := NewWithT(t)
	t.Setenv("POD_NAMESPACE", "sharder-system")
	o := &runOptions{cfg: config.Default()}
	cmd := newRunCommand(o)
	g.Expect(cmd.Flags().Parse(nil)).To(Succeed())
	g.Expect(o.complete(cmd.Flags())).To(Succeed())
	g.Expect(o.cfg.LeaderElection.Namespace).To(Equal("sharder-system"))
	g.Expect(o.cfg.Webhook.ServiceNamespace).To(Equal("sharder-system"))
}

func TestRunRejectsBadConfiguration(t *testing.T) {
	dir := t.TempDir()
	for name, tc := range map[string]struct {
		file string
		args []string
		want []string
	}{
		"flag breaks a timing rule": {
			args: []string{"--leader-election-renew-deadline", "20s"},
			want: []string{"invalid configuration", "leaderElection.renewDeadline", "less than leaderElection.leaseDuration"},
		},
		"file with a typo": {
			file: "leaderElection:\n  leaseDurtion: 20s\n",
			want: []string{"config file", `unknown field "leaderElection.leaseDurtion"`},
		},
		"file with a bad value, fixed by no flag": {
			file: "controllers:\n  assignment:\n    workers: 0\n",
			want: []string{"controllers.assignment.workers"},
		},
		"insecure metrics beyond localhost": {
			args: []string{"--metrics-secure=false"},
			want: []string{"metrics.secure", "without authentication"},
		},
		"missing file": {
			args: []string{"--config", filepath.Join(dir, "absent.yaml")},
			want: []string{"reading config file"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			args := append([]string{"--leader-election-namespace", "x"}, tc.args...)
			if tc.file != "" {
				path := filepath.Join(t.TempDir(), "config.yaml")
				g.Expect(os.WriteFile(path, []byte(tc.file), 0o600)).To(Succeed())
				args = append(args, "--config", path)
			}
			cmd := NewRunCommand()
			cmd.SetArgs(args)
			cmd.SetErr(io.Discard)
			cmd.SetOut(io.Discard)
			err := cmd.Execute()
			g.Expect(err).To(HaveOccurred())
			for _, want := range tc.want {
				g.Expect(err.Error()).To(ContainSubstring(want))
			}
		})
	}
}

// TestRunAgainstAPIServer starts `sharder run` against the local API server
// and checks what an operator relies on: probes, leader election, a released
// Lease on stop, and metrics closed to anonymous callers.
func TestRunAgainstAPIServer(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	healthPort, metricsPort := freePort(t), freePort(t)
	health := fmt.Sprintf("http://127.0.0.1:%d", healthPort)
	metrics := fmt.Sprintf("https://127.0.0.1:%d/metrics", metricsPort)

	stop, logs := startRun(t,
		"--kubeconfig", kubeconfig(t),
		"--leader-election-namespace", ns,
		"--leader-election-id", "sharder-test",
		"--health-probe-bind-address", "127.0.0.1:"+strconv.Itoa(healthPort),
		"--metrics-bind-address", "127.0.0.1:"+strconv.Itoa(metricsPort),
		"--webhook=false",
		"--log-format", "json",
	)

	g.Eventually(func() (int, error) {
		code, _, err := httpGet(health+"/healthz", "")
		return code, err
	}, 30*time.Second, 100*time.Millisecond).Should(Equal(http.StatusOK))
	g.Eventually(func() (string, error) {
		_, body, err := httpGet(health+"/readyz?verbose", "")
		return body, err
	}, 30*time.Second, 100*time.Millisecond).Should(And(
		ContainSubstring("[+]caches ok"), ContainSubstring("check passed")))

	ctx := context.Background()
	lease := &coordinationv1.Lease{}
	g.Eventually(func() (string, error) {
		err := env().Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "sharder-test"}, lease)
		return ptr.Deref(lease.Spec.HolderIdentity, ""), err
	}, 30*time.Second, 100*time.Millisecond).ShouldNot(BeEmpty(), "the leader election Lease is acquired")
	g.Expect(lease.Spec.LeaseDurationSeconds).To(HaveValue(BeEquivalentTo(15)))

	// Metrics are served over TLS and refuse anonymous callers.
	g.Eventually(func() (int, error) {
		code, _, err := httpGet(metrics, "")
		return code, err
	}, 30*time.Second, 100*time.Millisecond).Should(Equal(http.StatusUnauthorized))

	// An authenticated caller without RBAC is refused; one granted get on
	// /metrics reads them. (Two service accounts: the authorizer caches a
	// denial for 30s.)
	stranger := serviceAccountToken(t, ns, "stranger")
	code, _, err := httpGet(metrics, stranger)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(code).To(Equal(http.StatusForbidden))
	grantMetricsReader(t, ns, "scraper")
	scraper := serviceAccountToken(t, ns, "scraper")
	g.Eventually(func() (string, error) {
		code, body, err := httpGet(metrics, scraper)
		if code != http.StatusOK {
			return fmt.Sprint(code), err
		}
		return body, err
	}, 30*time.Second, 200*time.Millisecond).Should(ContainSubstring("leader_election_master_status"))
	// The sharder's families are registered where the endpoint reads.
	var registered prometheus.AlreadyRegisteredError
	g.Expect(errors.As(crmetrics.Registry.Register(smetrics.MovesTotal), &registered)).To(BeTrue(), "sharder_moves_total is registered")

	g.Expect(logs.String()).To(ContainSubstring(`"msg":"Starting sharder"`), "JSON logs")

	g.Expect(stop()).To(Succeed())
	g.Expect(env().Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "sharder-test"}, lease)).To(Succeed())
	g.Expect(ptr.Deref(lease.Spec.HolderIdentity, "")).To(BeEmpty(), "the Lease is released on stop")
	g.Expect(logs.String()).To(ContainSubstring("Sharder stopped"))
}

// TestRunWebhookReadiness checks that /readyz includes the webhook server
// once it serves TLS with the certificate in its folder.
func TestRunWebhookReadiness(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	certDir := t.TempDir()
	crt, key, err := cert.GenerateSelfSignedCertKey("sharder-webhook."+ns+".svc", nil, nil)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(os.WriteFile(filepath.Join(certDir, "tls.crt"), crt, 0o600)).To(Succeed())
	g.Expect(os.WriteFile(filepath.Join(certDir, "tls.key"), key, 0o600)).To(Succeed())

	healthPort, webhookPort := freePort(t), freePort(t)
	health := fmt.Sprintf("http://127.0.0.1:%d", healthPort)
	startRun(t,
		"--kubeconfig", kubeconfig(t),
		"--leader-elect=false",
		"--leader-election-namespace", ns,
		"--health-probe-bind-address", "127.0.0.1:"+strconv.Itoa(healthPort),
		"--metrics-bind-address", "0",
		"--webhook-port", strconv.Itoa(webhookPort),
		"--webhook-cert-mode", config.CertModeExternal,
		"--webhook-cert-dir", certDir,
	)
	g.Eventually(func() (string, error) {
		_, body, err := httpGet(health+"/readyz?verbose", "")
		return body, err
	}, 30*time.Second, 100*time.Millisecond).Should(And(
		ContainSubstring("[+]webhook ok"), ContainSubstring("[+]caches ok"), ContainSubstring("check passed")))
}

func serviceAccountToken(t *testing.T, ns, name string) string {
	t.Helper()
	ctx := context.Background()
	g := NewWithT(t)
	g.Expect(env().Client.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}})).To(Succeed())
	cs, err := kubernetes.NewForConfig(env().Config)
	g.Expect(err).NotTo(HaveOccurred())
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](600)},
	}, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	return tr.Status.Token
}

func grantMetricsReader(t *testing.T, ns, serviceAccount string) {
	t.Helper()
	ctx := context.Background()
	g := NewWithT(t)
	name := "metrics-reader-" + ns
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules:      []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}},
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: serviceAccount}},
	}
	g.Expect(env().Client.Create(ctx, role)).To(Succeed())
	g.Expect(env().Client.Create(ctx, binding)).To(Succeed())
	t.Cleanup(func() {
		_ = env().Client.Delete(context.Background(), binding)
		_ = env().Client.Delete(context.Background(), role)
	})
}

// TestRunWiresTheParts runs the sharder with every part on and checks each
// does its job: the lease controller sees an instance, the assignment
// controller labels a new object for it, and the webhook (self-managed
// certificate, called by the API server) refuses a stranger's label change.
func TestRunWiresTheParts(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := env().Namespace(t)
	t.Setenv("POD_NAMESPACE", ns)
	ringName := "run-" + ns

	ring := &v1alpha1.ControllerRing{
		ObjectMeta: metav1.ObjectMeta{Name: ringName},
		Spec: v1alpha1.ControllerRingSpec{
			LeaseNamespace: ns,
			Resources:      []v1alpha1.RingResource{{Group: "", Resource: "configmaps"}},
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{
				v1alpha1.LabelNamespaceName: ns,
			}},
		},
	}
	g.Expect(env().Client.Create(ctx, ring)).To(Succeed())
	t.Cleanup(func() { _ = env().Client.Delete(context.Background(), ring) })
	g.Expect(env().Client.Create(ctx, instanceLease(ns, ringName, "instance-a"))).To(Succeed())
	// A ring of unit Slots beside it, of another namespace.
	slotNS := env().Namespace(t)
	slotRing := &v1alpha1.ControllerRing{
		ObjectMeta: metav1.ObjectMeta{Name: "run-slots-" + ns},
		Spec: v1alpha1.ControllerRingSpec{
			LeaseNamespace: slotNS,
			Resources:      []v1alpha1.RingResource{{Group: "", Resource: "configmaps"}},
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{
				v1alpha1.LabelNamespaceName: slotNS,
			}},
			Assignment: &v1alpha1.RingAssignment{Unit: v1alpha1.AssignmentUnitSlots, Slots: &v1alpha1.RingSlots{Count: 8}},
		},
	}
	g.Expect(env().Client.Create(ctx, slotRing)).To(Succeed())
	t.Cleanup(func() { _ = env().Client.Delete(context.Background(), slotRing) })
	g.Expect(env().Client.Create(ctx, instanceLease(slotNS, slotRing.Name, "instance-s"))).To(Succeed())

	healthPort, webhookPort := freePort(t), freePort(t)
	health := fmt.Sprintf("http://127.0.0.1:%d", healthPort)
	configuration := "sharder-" + ns
	t.Cleanup(func() {
		_ = env().Client.Delete(context.Background(), &admissionregistrationv1.ValidatingWebhookConfiguration{
			ObjectMeta: metav1.ObjectMeta{Name: configuration},
		})
	})
	startRun(t,
		"--kubeconfig", kubeconfig(t),
		"--health-probe-bind-address", "127.0.0.1:"+strconv.Itoa(healthPort),
		"--metrics-bind-address", "0",
		"--webhook-port", strconv.Itoa(webhookPort),
		"--webhook-url", "https://127.0.0.1:"+strconv.Itoa(webhookPort),
		"--webhook-configuration-name", configuration,
		"--webhook-cert-dir", t.TempDir(),
	)

	g.Eventually(func() (string, error) {
		_, body, err := httpGet(health+"/readyz?verbose", "")
		return body, err
	}, 60*time.Second, 200*time.Millisecond).Should(And(
		ContainSubstring("[+]webhook ok"), ContainSubstring("[+]webhook-certificate ok"), ContainSubstring("check passed")))

	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "object"}}
	g.Expect(env().Client.Create(ctx, cm)).To(Succeed())
	g.Eventually(func() (string, error) {
		err := env().Client.Get(ctx, client.ObjectKeyFromObject(cm), cm)
		return cm.Labels[v1alpha1.ShardLabel(ringName)], err
	}, 30*time.Second, 100*time.Millisecond).Should(Equal("instance-a"))

	// The slot ring is served: its object gets its slot label, its table
	// grants every slot to its instance, its policy binding is written.
	slotted := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: slotNS, Name: "object"}}
	g.Expect(env().Client.Create(ctx, slotted)).To(Succeed())
	g.Eventually(func() (string, error) {
		err := env().Client.Get(ctx, client.ObjectKeyFromObject(slotted), slotted)
		return slotted.Labels[v1alpha1.SlotLabel(slotRing.Name)], err
	}, 30*time.Second, 100*time.Millisecond).Should(Equal(strconv.Itoa(slots.ForMainObject(&slotRing.Spec, "", "ConfigMap", slotNS, "object"))))
	g.Expect(slotted.Labels).NotTo(HaveKey(v1alpha1.ShardLabel(slotRing.Name)))
	g.Eventually(func(g Gomega) {
		r := &v1alpha1.ControllerRing{}
		g.Expect(env().Client.Get(ctx, client.ObjectKeyFromObject(slotRing), r)).To(Succeed())
		g.Expect(r.Status.Slots).NotTo(BeNil())
		g.Expect(r.Status.Slots.Instances).To(ConsistOf(v1alpha1.SlotHolder{Name: "instance-s", Granted: "0-7"}))
		g.Expect(r.Status.Members).To(ConsistOf(HaveField("Slots", BeEquivalentTo(8))))
	}, 30*time.Second, 100*time.Millisecond).Should(Succeed())
	g.Eventually(func() error {
		return env().Client.Get(ctx, client.ObjectKey{Name: slotpolicy.BindingName(slotRing.Name)}, &admissionregistrationv1.ValidatingAdmissionPolicyBinding{})
	}, 30*time.Second, 100*time.Millisecond).Should(Succeed())

	// The lease controller records through the command's event broadcaster:
	// core/v1 Events from the source "sharder".
	g.Eventually(func(g Gomega) []string {
		list := &corev1.EventList{}
		g.Expect(env().Client.List(ctx, list, client.InNamespace(ns))).To(Succeed())
		var out []string
		for _, e := range list.Items {
			if e.InvolvedObject.Kind == "Lease" && e.InvolvedObject.Name == "instance-a" {
				out = append(out, e.Source.Component+" "+e.Reason+": "+e.Message)
			}
		}
		return out
	}, 30*time.Second, 100*time.Millisecond).Should(ContainElement(`sharder StateChanged: Instance instance-a is ready (was "")`))

	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	g.Eventually(func() ([]byte, error) {
		err := env().Client.Get(ctx, client.ObjectKey{Name: configuration}, vwc)
		if err != nil || len(vwc.Webhooks) == 0 {
			return nil, err
		}
		return vwc.Webhooks[0].ClientConfig.CABundle, nil
	}, 30*time.Second, 100*time.Millisecond).ShouldNot(BeEmpty())

	// A user allowed to edit ConfigMaps may still not move the object.
	stranger := clientFor(t, ns, "stranger")
	g.Eventually(func() error {
		patch := []byte(`{"metadata":{"labels":{"` + v1alpha1.ShardLabel(ringName) + `":"instance-b"}}}`)
		return stranger.Patch(ctx, cm.DeepCopy(), client.RawPatch(types.MergePatchType, patch))
	}, 30*time.Second, 200*time.Millisecond).Should(MatchError(ContainSubstring(v1alpha1.ShardLabel(ringName))))

	// A label write with the sharder's credentials is denied unless its
	// field manager names the replica that holds the leader election Lease.
	lease := &coordinationv1.Lease{}
	g.Expect(env().Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "sharder"}, lease)).To(Succeed())
	holder := ptr.Deref(lease.Spec.HolderIdentity, "")
	g.Expect(holder).NotTo(BeEmpty())
	patch := []byte(`{"metadata":{"labels":{"` + v1alpha1.ShardLabel(ringName) + `":"instance-b"}}}`)
	err := env().Client.Patch(ctx, cm.DeepCopy(), client.RawPatch(types.MergePatchType, patch), client.FieldOwner(webhook.LeaderFieldManager("another-replica")))
	g.Expect(err).To(MatchError(ContainSubstring(holder)), "a sharder write from a replica that does not lead")

	// The election records its events through the command's broadcaster.
	g.Eventually(func(g Gomega) []string {
		list := &corev1.EventList{}
		g.Expect(env().Client.List(ctx, list, client.InNamespace(ns))).To(Succeed())
		var out []string
		for _, e := range list.Items {
			if e.InvolvedObject.Kind == "Lease" && e.InvolvedObject.Name == "sharder" {
				out = append(out, e.Source.Component+" "+e.Reason)
			}
		}
		return out
	}, 30*time.Second, 100*time.Millisecond).Should(ContainElement("sharder LeaderElection"))
}

// instanceLease returns a ready instance Lease of ring, valid for an hour.
func instanceLease(ns, ring, id string) *coordinationv1.Lease {
	return fixture.InstanceLease(ring, ns, id, time.Now(), time.Hour)
}

// clientFor returns a client acting as service account name in ns, allowed
// to read and write ConfigMaps there.
func clientFor(t *testing.T, ns, name string) client.Client {
	t.Helper()
	ctx := context.Background()
	g := NewWithT(t)
	token := serviceAccountToken(t, ns, name)
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"},
			Verbs: []string{"get", "list", "watch", "create", "update", "patch"}}},
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name}},
	}
	g.Expect(env().Client.Create(ctx, role)).To(Succeed())
	g.Expect(env().Client.Create(ctx, binding)).To(Succeed())
	cfg := rest.AnonymousClientConfig(env().Config)
	cfg.BearerToken = token
	c, err := client.New(cfg, client.Options{Scheme: env().Scheme})
	g.Expect(err).NotTo(HaveOccurred())
	return c
}
