package webhook_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/sharder-dev/sharder/internal/fixture"
	"github.com/sharder-dev/sharder/internal/testenv"
	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/sharder/metrics"
	"github.com/sharder-dev/sharder/pkg/sharder/webhook"
)

var suite testenv.Suite // the control plane, started for the first test that calls env

func env() *testenv.Env { return suite.Env() }

func TestMain(m *testing.M) {
	// Each manager logs through its own logger (Options.Logger); the
	// process-wide one is silenced.
	logf.SetLogger(logr.Discard())
	scheme := testenv.DefaultScheme()
	utilruntime.Must(v1alpha1.AddToScheme(scheme))
	os.Exit(testenv.Run(m, &suite, testenv.Options{CRDDirectoryPaths: []string{"config/crd/bases", "pkg/sharder/webhook/testdata/crds"}, Scheme: scheme}))
}

// Identities of the tests. Each is bound to cluster-admin, so RBAC never
// stands in the way: whatever is denied is denied by the webhook.
const (
	sharderNamespace = "sharder-system"
	sharderUser      = "system:serviceaccount:sharder-system:sharder"
	userAlice        = "alice"
	instanceNS       = "operators"
	instanceSA       = "instance"
	instanceUser     = "system:serviceaccount:operators:instance"
)

var setupUsers = sync.OnceValue(func() error {
	ctx := context.Background()
	for _, obj := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: sharderNamespace}},
		&rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "webhook-test-users"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
			Subjects: []rbacv1.Subject{
				{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: sharderUser},
				{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: userAlice},
				{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: instanceUser},
			},
		},
	} {
		if err := env().Client.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	return nil
})

// configAs returns an admin rest config impersonating user.
func configAs(t testing.TB, user string) *rest.Config {
	t.Helper()
	if err := setupUsers(); err != nil {
		t.Fatalf("creating test users: %v", err)
	}
	cfg := rest.CopyConfig(env().Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	if user != userAlice {
		cfg.Impersonate.Groups = []string{"system:serviceaccounts", "system:authenticated"}
	}
	return cfg
}

func clientAs(t testing.TB, user string) client.Client {
	t.Helper()
	c, err := client.New(configAs(t, user), client.Options{Scheme: env().Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// sharder is a running manager with the webhook set up, as `sharder run`
// would have it, serving on a local port.
type sharder struct {
	opts     webhook.Options
	cancel   context.CancelFunc
	done     chan error
	stopOnce sync.Once
}

// stop stops the manager and waits for it to end.
func (s *sharder) stop(t testing.TB) {
	t.Helper()
	s.stopOnce.Do(func() {
		s.cancel()
		select {
		case err := <-s.done:
			if err != nil {
				t.Errorf("manager: %v", err)
			}
		case <-time.After(90 * time.Second):
			t.Error("manager did not stop")
		}
	})
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startSharder starts a manager running as the sharder's service account,
// with a webhook server on 127.0.0.1 and the configuration in URL mode.
// Unset fields of opts get a configuration and Secret name of their own.
// The manager stops and the configuration is deleted when the test ends.
func startSharder(t testing.TB, opts webhook.Options, serverOpts ...func(*ctrlwebhook.Options)) *sharder {
	t.Helper()
	port := freePort(t)
	suffix := rand.String(5)
	if opts.ConfigurationName == "" {
		opts.ConfigurationName = "sharder-test-" + suffix
	}
	if opts.SecretName == "" {
		opts.SecretName = "webhook-tls-" + suffix
	}
	opts.Namespace = sharderNamespace
	opts.URL = "https://127.0.0.1:" + strconv.Itoa(port)
	if opts.ResyncPeriod == 0 {
		opts.ResyncPeriod = 5 * time.Second
	}
	so := ctrlwebhook.Options{Host: "127.0.0.1", Port: port}
	for _, f := range serverOpts {
		f(&so)
	}
	mgrOpts := env().ManagerOptions()
	mgrOpts.Logger = zap.New(zap.UseDevMode(true), zap.WriteTo(testWriter{t}))
	mgrOpts.WebhookServer = ctrlwebhook.NewServer(so)
	mgr := env().NewManager(t, configAs(t, sharderUser), mgrOpts)
	if err := webhook.Setup(mgr, opts); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &sharder{opts: opts, cancel: cancel, done: make(chan error, 1)}
	go func() { s.done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		s.stop(t)
		err := env().Client.Delete(context.Background(), &admissionregistrationv1.ValidatingWebhookConfiguration{
			ObjectMeta: metav1.ObjectMeta{Name: opts.ConfigurationName}})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting the webhook configuration: %v", err)
		}
		err = env().Client.Delete(context.Background(), &admissionregistrationv1.MutatingWebhookConfiguration{
			ObjectMeta: metav1.ObjectMeta{Name: opts.ConfigurationName}})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting the mutating webhook configuration: %v", err)
		}
	})
	return s
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	if testing.Verbose() {
		w.t.Logf("%s", p)
	}
	return len(p), nil
}

// createRing creates a ring of ConfigMaps (main) and Secrets (controlled)
// whose Leases live in leaseNS, deleted when the test ends.
func createRing(t testing.TB, leaseNS string, mutate ...func(*v1alpha1.ControllerRing)) *v1alpha1.ControllerRing {
	t.Helper()
	r := &v1alpha1.ControllerRing{
		ObjectMeta: metav1.ObjectMeta{Name: "ring-" + rand.String(6)},
		Spec: v1alpha1.ControllerRingSpec{
			LeaseNamespace: leaseNS,
			Resources: []v1alpha1.RingResource{{
				Resource:            "configmaps",
				ControlledResources: []metav1.GroupResource{{Resource: "secrets"}},
			}},
			InstanceServiceAccounts: []v1alpha1.ServiceAccountReference{{Namespace: instanceNS, Name: instanceSA}},
		},
	}
	for _, m := range mutate {
		m(r)
	}
	if err := env().Client.Create(context.Background(), r); err != nil {
		t.Fatalf("creating ControllerRing: %v", err)
	}
	t.Cleanup(func() {
		if err := env().Client.Delete(context.Background(), r); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting ControllerRing %s: %v", r.Name, err)
		}
	})
	return r
}

// createLease creates an instance Lease of ring renewed at renewed, for d.
func createLease(t testing.TB, c client.Client, ns, ring, name string, renewed time.Time, d time.Duration) {
	t.Helper()
	if err := c.Create(context.Background(), fixture.InstanceLease(ring, ns, name, renewed, d)); err != nil {
		t.Fatalf("creating Lease %s: %v", name, err)
	}
}

// webhookCalls is how many requests of ring the handler has answered:
// every series of the decisions counter for the ring, whatever its decision
// and reason, so that a call with a reason added later is counted too.
func webhookCalls(ring string) float64 {
	ch := make(chan prometheus.Metric, 256)
	go func() {
		metrics.WebhookDecisionsTotal.Collect(ch)
		close(ch)
	}()
	total := 0.0
	for m := range ch {
		var out dto.Metric
		if err := m.Write(&out); err != nil {
			panic(fmt.Sprintf("reading the webhook decisions counter: %v", err))
		}
		for _, l := range out.GetLabel() {
			if l.GetName() == metrics.LabelRing && l.GetValue() == ring {
				total += out.GetCounter().GetValue()
			}
		}
	}
	return total
}

// waitProtected waits until a label edit by alice on a probe ConfigMap of
// ring is denied by the webhook: the configuration is written, the API
// server has loaded it and the server answers. It returns the probe.
func waitProtected(t testing.TB, ring, ns string) *corev1.ConfigMap {
	t.Helper()
	g := NewWithT(t)
	probe := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "probe-" + rand.String(5), Namespace: ns,
		Labels: map[string]string{v1alpha1.ShardLabel(ring): "probe"}}}
	g.Expect(clientAs(t, sharderUser).Create(context.Background(), probe)).To(Succeed())
	alice := clientAs(t, userAlice)
	g.Eventually(func() error {
		cm := &corev1.ConfigMap{}
		if err := alice.Get(context.Background(), client.ObjectKeyFromObject(probe), cm); err != nil {
			return err
		}
		cm.Labels[v1alpha1.ShardLabel(ring)] = "other"
		err := alice.Update(context.Background(), cm, client.DryRunAll)
		if err == nil {
			return errors.New("label edit allowed: webhook not active yet")
		}
		if !apierrors.IsForbidden(err) {
			return fmt.Errorf("not (yet) denied by the webhook: %w", err)
		}
		return nil
	}).WithTimeout(30 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())
	return probe
}
