package controller_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	etcdv1alpha1 "github.com/sharder-dev/sharder/examples/etcd-operator/api/v1alpha1"
	"github.com/sharder-dev/sharder/examples/etcd-operator/internal/controller"
	"github.com/sharder-dev/sharder/examples/etcd-operator/internal/etcdtest"
	"github.com/sharder-dev/sharder/internal/testenv"
	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

var suite testenv.Suite // the control plane, started for the first test that calls env

func env() *testenv.Env { return suite.Env() }

func TestMain(m *testing.M) {
	scheme := testenv.DefaultScheme()
	utilruntime.Must(etcdv1alpha1.AddToScheme(scheme))
	utilruntime.Must(sharderv1alpha1.AddToScheme(scheme))
	ctrl.SetLogger(zap.New(zap.WriteTo(io.Discard)))
	os.Exit(testenv.Run(m, &suite, testenv.Options{
		CRDDirectoryPaths: []string{"examples/etcd-operator/config/crd", "config/crd/bases"},
		Scheme:            scheme,
	}))
}

const (
	// timeout bounds every wait. Several waits include starting a real etcd
	// of up to three members for a cluster (localEtcd), which on a loaded
	// machine (the tests of other packages compiling and running beside
	// these) takes well over the few seconds it takes when idle; etcdtest
	// itself allows a member a minute to answer.
	timeout  = time.Minute
	interval = 50 * time.Millisecond
)

// inNamespace returns manager options whose cache holds the objects of ns
// only. Every test's operator sees its own namespace alone, so that the
// tests run in parallel without reconciling each other's clusters.
func inNamespace(ns string) ctrl.Options {
	return ctrl.Options{Cache: cache.Options{DefaultNamespaces: map[string]cache.Config{ns: {}}}}
}

// startManager runs a manager with the reconciler until the test ends, or
// until stop is called. Its cache must be limited to the test's namespace
// (inNamespace): the tests run in parallel.
func startManager(t *testing.T, opts controller.Options, mgrOpts ctrl.Options) (_ ctrl.Manager, stop func()) {
	t.Helper()
	if len(mgrOpts.Cache.DefaultNamespaces) == 0 {
		t.Fatal("startManager: the manager's cache must be limited to the test's namespace (inNamespace): the tests run in parallel")
	}
	testOpts := env().ManagerOptions()
	mgrOpts.Scheme, mgrOpts.Metrics, mgrOpts.Controller = testOpts.Scheme, testOpts.Metrics, testOpts.Controller
	mgr := env().NewManager(t, nil, mgrOpts)
	if opts.APIReader == nil {
		opts.APIReader = mgr.GetAPIReader()
	}
	if opts.RecoveryInterval == 0 {
		opts.RecoveryInterval = 200 * time.Millisecond
	}
	if opts.DeletionRecheckInterval == 0 {
		opts.DeletionRecheckInterval = 200 * time.Millisecond
	}
	if opts.Endpoints == nil {
		opts.Endpoints = localEtcd(t)
	}
	if opts.EtcdTimeout == 0 {
		opts.EtcdTimeout = 2 * time.Second
	}
	if opts.EtcdCheckInterval == 0 {
		opts.EtcdCheckInterval = 500 * time.Millisecond
	}
	r := controller.NewReconciler(mgr.GetClient(), mgr.GetScheme(), mgr.GetEventRecorder("etcd-operator"), opts)
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatalf("setting up the controller: %v", err)
	}
	stop = testenv.StartManager(t, mgr)
	return mgr, stop
}

// localEtcd returns where the operator asks etcd about a cluster in these
// tests: no kubelet runs here, so the member pods (which the tests play) run
// no etcd. The first time a cluster is asked about, a real etcd of its size
// (at most 3 members) starts for it, named as its members would be; until it
// answers, the cluster has no address (a reconcile never waits for it). It
// stays healthy, so the pods' readiness, which the tests set, decides the
// phase.
func localEtcd(t *testing.T) func(*etcdv1alpha1.EtcdCluster, []corev1.Pod) []string {
	t.Helper()
	var (
		mu       sync.Mutex
		wg       sync.WaitGroup
		clusters = map[string][]string{}
	)
	// The managers see every namespace: clusters earlier tests left behind
	// get no etcd (creation times have whole seconds: one made in the same
	// second gets one, needlessly but harmlessly).
	since := metav1.NewTime(time.Now().Truncate(time.Second))
	// Runs after the managers stopped: no start is left behind.
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	return func(c *etcdv1alpha1.EtcdCluster, _ []corev1.Pod) []string {
		mu.Lock()
		defer mu.Unlock()
		key := c.Namespace + "/" + c.Name
		if urls, ok := clusters[key]; ok {
			return urls
		}
		if c.CreationTimestamp.Before(&since) {
			return nil
		}
		clusters[key] = nil
		n := min(max(c.Spec.Size, 1), 3)
		names := make([]string, n)
		for i := range names {
			names[i] = fmt.Sprintf("%s-%d", c.Name, i)
		}
		wg.Go(func() {
			local, err := etcdtest.StartContext(ctx, t, names...)
			if err != nil {
				if ctx.Err() == nil && !errors.Is(err, etcdtest.ErrTestEnded) {
					t.Errorf("etcd for %s: %v", key, err)
				}
				return
			}
			mu.Lock()
			clusters[key] = local.ClientURLs()
			mu.Unlock()
		})
		return nil
	}
}

func newCluster(ns, name string, size int32) *etcdv1alpha1.EtcdCluster {
	return &etcdv1alpha1.EtcdCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       etcdv1alpha1.EtcdClusterSpec{Size: size},
	}
}

// getCluster returns a function for Eventually that reads the cluster.
func getCluster(ctx context.Context, c *etcdv1alpha1.EtcdCluster) func(Gomega) *etcdv1alpha1.EtcdCluster {
	return func(g Gomega) *etcdv1alpha1.EtcdCluster {
		out := &etcdv1alpha1.EtcdCluster{}
		g.Expect(env().Client.Get(ctx, client.ObjectKeyFromObject(c), out)).To(Succeed())
		return out
	}
}

// setReadyReplicas plays the StatefulSet controller and kubelet, which the
// test control plane does not run: it reports ready members.
func setReadyReplicas(ctx context.Context, g Gomega, ns, name string, ready int32) {
	g.Eventually(func(g Gomega) {
		sts := &appsv1.StatefulSet{}
		g.Expect(env().Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, sts)).To(Succeed())
		sts.Status.Replicas = *sts.Spec.Replicas
		sts.Status.ReadyReplicas = ready
		sts.Status.AvailableReplicas = ready
		sts.Status.ObservedGeneration = sts.Generation
		g.Expect(env().Client.Status().Update(ctx, sts)).To(Succeed())
	}, timeout, interval).Should(Succeed())
}

func havePhase(p etcdv1alpha1.EtcdClusterPhase) OmegaMatcher {
	return WithTransform(func(c *etcdv1alpha1.EtcdCluster) etcdv1alpha1.EtcdClusterPhase { return c.Status.Phase }, Equal(p))
}

func haveCondition(typ string, status metav1.ConditionStatus, reason string) OmegaMatcher {
	return WithTransform(func(c *etcdv1alpha1.EtcdCluster) string {
		cond := meta.FindStatusCondition(c.Status.Conditions, typ)
		if cond == nil {
			return "<none>"
		}
		return fmt.Sprintf("%s/%s", cond.Status, cond.Reason)
	}, Equal(fmt.Sprintf("%s/%s", status, reason)))
}

// eventReasons lists the reasons of the events about the cluster.
func eventReasons(ctx context.Context, c *etcdv1alpha1.EtcdCluster) func(Gomega) []string {
	return func(g Gomega) []string {
		list := &eventsv1.EventList{}
		g.Expect(env().Client.List(ctx, list, client.InNamespace(c.Namespace))).To(Succeed())
		var out []string
		for _, e := range list.Items {
			if e.Regarding.Name == c.Name && e.Regarding.Kind == "EtcdCluster" {
				out = append(out, e.Reason)
			}
		}
		return out
	}
}

// expectGone asserts obj does not exist (eventually).
func expectGone(ctx context.Context, g Gomega, obj client.Object) {
	g.Eventually(func() bool {
		return apierrors.IsNotFound(env().Client.Get(ctx, client.ObjectKeyFromObject(obj), obj))
	}, timeout, interval).Should(BeTrue(), "%T %s still exists", obj, obj.GetName())
}

func objectsOf(c *etcdv1alpha1.EtcdCluster) []client.Object {
	ns := c.Namespace
	return []client.Object{
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: c.Name + "-config"}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: c.Name + "-peer"}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: c.Name + "-client"}},
		&appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: c.Name}},
		&policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: c.Name}},
	}
}
