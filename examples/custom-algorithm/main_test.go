package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/cmd/sharder/app"
	"github.com/sharder-dev/sharder/internal/testenv"
	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/ring"
)

var suite testenv.Suite // the control plane, started for the first test that calls env

func env() *testenv.Env { return suite.Env() }

func TestMain(m *testing.M) {
	s := testenv.DefaultScheme()
	utilruntime.Must(v1alpha1.AddToScheme(s))
	os.Exit(testenv.Run(m, &suite, testenv.Options{CRDDirectoryPaths: []string{"config/crd/bases"}, Scheme: s}))
}

// syncBuffer collects the sharder's logs, shown when the test fails.
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

// TestRingUsesTheRegisteredAlgorithm runs this program's command, `sharder
// run`, against a real API server with a ring that names by-namespace: the
// ring is ready and every object gets the instance by-namespace picks for
// its namespace, so all objects of a namespace share one instance (the
// default algorithm would split them).
func TestRingUsesTheRegisteredAlgorithm(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	leaseNS, nsA, nsB := env().Namespace(t), env().Namespace(t), env().Namespace(t)
	ringName := "by-namespace-" + leaseNS

	instances := []string{"inst-0", "inst-1", "inst-2"}
	for _, id := range instances {
		now := metav1.NewMicroTime(time.Now())
		g.Expect(env().Client.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: leaseNS, Name: id, Labels: map[string]string{v1alpha1.LabelRing: ringName}},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity:       ptr.To(id),
				LeaseDurationSeconds: ptr.To(int32(3600)),
				AcquireTime:          &now,
				RenewTime:            &now,
			},
		})).To(Succeed())
	}
	rg := &v1alpha1.ControllerRing{
		ObjectMeta: metav1.ObjectMeta{Name: ringName},
		Spec: v1alpha1.ControllerRingSpec{
			LeaseNamespace: leaseNS,
			Resources:      []v1alpha1.RingResource{{Resource: "configmaps"}},
			NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
				Key: v1alpha1.LabelNamespaceName, Operator: metav1.LabelSelectorOpIn, Values: []string{nsA, nsB},
			}}},
			Algorithm: Algorithm,
		},
	}
	g.Expect(env().Client.Create(ctx, rg)).To(Succeed())
	t.Cleanup(func() { _ = env().Client.Delete(context.Background(), rg) })
	const perNamespace = 12
	for _, ns := range []string{nsA, nsB} {
		for i := range perNamespace {
			g.Expect(env().Client.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("cm-%d", i)}})).To(Succeed())
		}
	}

	// What the registered algorithm says; the default one would spread a
	// namespace's objects over the instances.
	members := make([]ring.Member, 0, len(instances))
	for _, id := range instances {
		members = append(members, ring.Member{ID: id, VirtualNodes: v1alpha1.DefaultVirtualNodes})
	}
	byNS, err := ring.New(Algorithm, members)
	g.Expect(err).NotTo(HaveOccurred())
	def, err := ring.New(ring.ConsistentHash, members)
	g.Expect(err).NotTo(HaveOccurred())
	spread := map[string]bool{}
	for i := range perNamespace {
		id, err := def.Lookup(ring.ObjectKey("", "ConfigMap", nsA, fmt.Sprintf("cm-%d", i)))
		g.Expect(err).NotTo(HaveOccurred())
		spread[id] = true
	}
	g.Expect(len(spread)).To(BeNumerically(">", 1), "the default algorithm splits a namespace, so the test tells them apart")

	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	g.Expect(env().WriteKubeConfig(kubeconfig)).To(Succeed())
	cmd := app.NewRootCommand()
	logs := &syncBuffer{}
	cmd.SetErr(logs)
	cmd.SetOut(io.Discard)
	cmd.SetArgs([]string{"run",
		"--kubeconfig", kubeconfig,
		"--leader-elect=false",
		"--leader-election-namespace", leaseNS,
		"--webhook=false",
		"--metrics-bind-address", "0",
		"--health-probe-bind-address", "0",
	})
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(runCtx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("sharder run: %v", err)
			}
		case <-time.After(60 * time.Second):
			t.Error("sharder run did not stop within 60s")
		}
		if t.Failed() {
			t.Logf("sharder logs:\n%s", logs.String())
		}
	})

	// The command sets the process-wide klog logger first thing: wait until
	// it has, so that this test's own API requests, which log through klog,
	// do not race with that write.
	g.Eventually(logs.String, 30*time.Second, 20*time.Millisecond).Should(ContainSubstring("Starting sharder"))

	g.Eventually(func(g Gomega) {
		r := &v1alpha1.ControllerRing{}
		g.Expect(env().Client.Get(ctx, client.ObjectKey{Name: ringName}, r)).To(Succeed())
		cond := meta.FindStatusCondition(r.Status.Conditions, v1alpha1.ConditionReady)
		g.Expect(cond).NotTo(BeNil())
		g.Expect(cond.Status).To(Equal(metav1.ConditionTrue), cond.Message)
		g.Expect(r.Status.AvailableInstances).To(BeEquivalentTo(len(instances)))
	}, 60*time.Second, 100*time.Millisecond).Should(Succeed())
	for _, ns := range []string{nsA, nsB} {
		want, err := byNS.Lookup(ring.ObjectKey("", "ConfigMap", ns, "any"))
		g.Expect(err).NotTo(HaveOccurred())
		g.Eventually(func(g Gomega) {
			list := &corev1.ConfigMapList{}
			g.Expect(env().Client.List(ctx, list, client.InNamespace(ns))).To(Succeed())
			n := 0
			for _, cm := range list.Items {
				if cm.Name == "kube-root-ca.crt" {
					continue
				}
				n++
				g.Expect(cm.Labels).To(HaveKeyWithValue(v1alpha1.ShardLabel(ringName), want), cm.Name)
			}
			g.Expect(n).To(Equal(perNamespace))
		}, 30*time.Second, 100*time.Millisecond).Should(Succeed())
	}
}
