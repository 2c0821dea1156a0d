package cluster

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/internal/localrun"
)

// flowControlObjects is how many ConfigMaps the flow control scenario adds
// to the plain controller's ring by default: enough for thousands of label
// writes, small enough to add well under a minute to the suite.
// SHARDER_E2E_FLOWCONTROL_OBJECTS sets another number (10000: the size of
// rebalance the FlowSchemas are meant for).
const flowControlObjects = 1000

// flowControlLabel marks the scenario's ConfigMaps, so that they are
// deleted together at its end.
const flowControlLabel = "e2e.sharder.dev/flow-control"

// testFlowControl: the chart's FlowSchemas, with the plain controller's
// ServiceAccount named as an instance account (helm upgrade), send the
// Lease requests of the sharder and of the plain controller's agents to the
// leader-election level and the sharder's label patches to its own level,
// as the API server's classification headers show. The sharder and the
// instances run as their ServiceAccounts, as pods. The plain controller
// goes from 3 to 4 pods over many ConfigMaps: the rebalance finishes, no
// instance loses its Lease (same holder, no transition, no restarted
// container) and the sharder keeps its leader.
func testFlowControl(t *testing.T) {
	g := NewWithT(t)
	ctx := t.Context()
	objects := flowControlObjects
	if n := os.Getenv("SHARDER_E2E_FLOWCONTROL_OBJECTS"); n != "" {
		var err error
		if objects, err = strconv.Atoi(n); err != nil || objects < 1 {
			t.Fatalf("SHARDER_E2E_FLOWCONTROL_OBJECTS=%q: want a positive number of objects", n)
		}
	}
	timeout := 3*time.Minute + time.Duration(objects)*30*time.Millisecond

	// SHARDER_E2E_FLOWCONTROL_SHARED: the same run without the FlowSchemas,
	// for comparison; it reports what was lost and asserts nothing of it.
	without := os.Getenv("SHARDER_E2E_FLOWCONTROL_SHARED") != ""
	sharderSA := localrun.ServiceAccountUser(sharderNamespace, release)
	plainSA := localrun.ServiceAccountUser(plainNamespace, plainName)
	agentLease := "/apis/coordination.k8s.io/v1/namespaces/" + plainNamespace + "/leases/" + plainName + "-0"
	leaderLease := "/apis/coordination.k8s.io/v1/namespaces/" + sharderNamespace + "/leases/" + release
	labelPatch := "/api/v1/namespaces/" + plainObjects + "/configmaps/object-00?dryRun=All"
	if without {
		By(t, "helm upgrade without the FlowSchemas: the sharder's Lease requests share the flow of its label patches")
		out, err := helm(ctx, "upgrade", release, filepath.Join(repoRoot, "charts", "sharder"), "--namespace", sharderNamespace, "--reuse-values",
			"--set", "flowControl.enabled=false", "--wait", "--timeout", "3m")
		g.Expect(err).NotTo(HaveOccurred(), out)
		g.Eventually(func() classification { return classifyAs(t, sharderSA, http.MethodGet, leaderLease) }).
			WithTimeout(time.Minute).WithPolling(time.Second).Should(Equal(classifyAs(t, sharderSA, http.MethodPatch, labelPatch)))
	} else {
		By(t, "helm upgrade names the plain controller's ServiceAccount for the Lease FlowSchema")
		accounts := fmt.Sprintf(`flowControl.instanceServiceAccounts=[{"namespace":%q,"name":%q}]`, plainNamespace, plainName)
		out, err := helm(ctx, "upgrade", release, filepath.Join(repoRoot, "charts", "sharder"), "--namespace", sharderNamespace, "--reuse-values",
			"--set-json", accounts, "--wait", "--timeout", "3m")
		g.Expect(err).NotTo(HaveOccurred(), out)
		leases, writes := uidOf[flowcontrolv1.FlowSchema](ctx, g, release+"-leases"), uidOf[flowcontrolv1.FlowSchema](ctx, g, release+"-writes")
		leaderElection := uidOf[flowcontrolv1.PriorityLevelConfiguration](ctx, g, "leader-election")
		writesLevel := uidOf[flowcontrolv1.PriorityLevelConfiguration](ctx, g, release+"-writes")
		g.Eventually(func() classification { return classifyAs(t, plainSA, http.MethodGet, agentLease) }).
			WithTimeout(time.Minute).WithPolling(time.Second).Should(Equal(classification{leases, leaderElection}), "an agent's Lease request")
		g.Expect(classifyAs(t, sharderSA, http.MethodGet, leaderLease)).To(Equal(classification{leases, leaderElection}), "the sharder's leader election")
		g.Expect(classifyAs(t, sharderSA, http.MethodPatch, labelPatch)).To(Equal(classification{writes, writesLevel}), "the sharder's label patch")
	}

	By(t, fmt.Sprintf("3 plain controller pods, %d more ConfigMaps", objects))
	scaleStatefulSet(ctx, g, plainNamespace, plainName, 3)
	waitStatefulSetReady(ctx, g, plainNamespace, plainName, 3)
	ids3 := []string{plainName + "-0", plainName + "-1", plainName + "-2"}
	waitRingReady(ctx, g, plainRing, ids3)
	tracker, err := localrun.NewLabelWatch(restConfig, corev1.SchemeGroupVersion.WithResource("configmaps"), plainObjects, plainRing)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(tracker.Start(ctx)).To(Succeed())
	t.Cleanup(func() {
		// The later scenarios run beside 2 plain controller pods and their
		// 13 ConfigMaps, as before this one.
		ctx := context.Background()
		_ = k8sClient.DeleteAllOf(ctx, &corev1.ConfigMap{}, client.InNamespace(plainObjects), client.HasLabels{flowControlLabel})
		var sts appsv1.StatefulSet
		if k8sClient.Get(ctx, client.ObjectKey{Namespace: plainNamespace, Name: plainName}, &sts) == nil {
			patch := client.MergeFrom(sts.DeepCopy())
			sts.Spec.Replicas = ptr.To[int32](2)
			_ = k8sClient.Patch(ctx, &sts, patch)
		}
	})
	total := plainConfigMaps + 1 + objects
	start := time.Now()
	createLabelledConfigMaps(ctx, t, plainObjects, objects)
	created := time.Since(start)
	waitSettledWithin(ctx, t, tracker, total, ids3, timeout)
	t.Logf("%d ConfigMaps created in %s, all %d on 3 instances %s after the first",
		objects, created.Round(time.Millisecond), total, time.Since(start).Round(time.Millisecond))

	before := leaseRecords(ctx, g, ids3)
	restartsBefore := containerRestarts(ctx, g)

	By(t, "scaled to 4 pods, the ConfigMaps rebalance; no Lease is lost")
	start = time.Now()
	scaleStatefulSet(ctx, g, plainNamespace, plainName, 4)
	ids4 := append(slices.Clone(ids3), plainName+"-3")
	waitRingReady(ctx, g, plainRing, ids4)
	joined := time.Since(start)
	after := waitSettledWithin(ctx, t, tracker, total, ids4, timeout)
	rebalanced := time.Since(start)
	moved := after.Counts()[plainName+"-3"]
	lost := map[string]string{}
	now := leaseRecords(ctx, g, ids3)
	for name, l := range before {
		if now[name] != l {
			lost[name] = fmt.Sprintf("%+v, was %+v", now[name], l)
		}
	}
	for name, n := range containerRestarts(ctx, g) {
		if n != restartsBefore[name] {
			lost[name] = fmt.Sprintf("%d restarts, was %d", n, restartsBefore[name])
		}
	}
	t.Logf("3 → 4 pods: the new instance ready after %s, %d ConfigMaps moved to it, all %d settled %s after the scale-up; Leases lost or containers restarted: %v\n%s",
		joined.Round(time.Millisecond), moved, total, rebalanced.Round(time.Millisecond), lost, localrun.FormatCounts(after.Counts()))
	if !without {
		g.Expect(lost).To(BeEmpty(), "no instance and no sharder replica lost its Lease")
	}
}

// leaseRecord is what changes when a Lease changes hands.
type leaseRecord struct {
	Holder      string
	Transitions int32
}

// leaseRecords reads the instances' Leases and the sharder's leader
// election Lease.
func leaseRecords(ctx context.Context, g Gomega, ids []string) map[string]leaseRecord {
	out := map[string]leaseRecord{}
	keys := []client.ObjectKey{{Namespace: sharderNamespace, Name: release}}
	for _, id := range ids {
		keys = append(keys, client.ObjectKey{Namespace: plainNamespace, Name: id})
	}
	for _, key := range keys {
		var l coordinationv1.Lease
		g.Expect(k8sClient.Get(ctx, key, &l)).To(Succeed())
		out[key.String()] = leaseRecord{Holder: ptr.Deref(l.Spec.HolderIdentity, ""), Transitions: ptr.Deref(l.Spec.LeaseTransitions, 0)}
	}
	return out
}

// containerRestarts returns the restart count of every container (the
// agents, native sidecars, among the init containers) of the sharder's and
// the plain controller's pods, by pod and container.
func containerRestarts(ctx context.Context, g Gomega) map[string]int32 {
	out := map[string]int32{}
	for _, ns := range []string{sharderNamespace, plainNamespace} {
		var pods corev1.PodList
		g.Expect(k8sClient.List(ctx, &pods, client.InNamespace(ns))).To(Succeed())
		for _, p := range pods.Items {
			for _, s := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
				out[ns+"/"+p.Name+"/"+s.Name] = s.RestartCount
			}
		}
	}
	return out
}

func scaleStatefulSet(ctx context.Context, g Gomega, namespace, name string, n int32) {
	var sts appsv1.StatefulSet
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &sts)).To(Succeed())
	patch := client.MergeFrom(sts.DeepCopy())
	sts.Spec.Replicas = ptr.To(n)
	g.Expect(k8sClient.Patch(ctx, &sts, patch)).To(Succeed())
}

// createLabelledConfigMaps creates n ConfigMaps flow-<i>, labelled
// flowControlLabel, eight at a time.
func createLabelledConfigMaps(ctx context.Context, t *testing.T, namespace string, n int) {
	t.Helper()
	// The admin client keeps client-go's default limit of 5 requests a
	// second.
	cfg := rest.CopyConfig(restConfig)
	cfg.QPS, cfg.Burst = 1000, 2000
	c, err := client.New(cfg, client.Options{Scheme: k8sClient.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	next := make(chan int)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: fmt.Sprintf("flow-%05d", i),
					Labels: map[string]string{flowControlLabel: "true"}}}
				if err := c.Create(ctx, cm); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	if first != nil {
		t.Fatalf("creating ConfigMaps: %v", first)
	}
}

// waitSettledWithin is waitSettledOn for ConfigMaps with a timeout of its
// own.
func waitSettledWithin(ctx context.Context, t *testing.T, tracker *localrun.LabelWatch, n int, ids []string, timeout time.Duration) localrun.Assignment {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := tracker.Wait(ctx, localrun.SettledOn(configMapKind, n, ids...)); err != nil {
		t.Fatalf("%d ConfigMaps did not settle on %v within %s: %v\n%s", n, ids, timeout, err, localrun.FormatCounts(tracker.Assignment().Counts()))
	}
	return tracker.Assignment()
}

func uidOf[T any, PT interface {
	*T
	client.Object
}](ctx context.Context, g Gomega, name string) types.UID {
	obj := PT(new(T))
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Name: name}, obj)).To(Succeed())
	return obj.GetUID()
}

// classification is where API Priority and Fairness put a request: the
// UIDs of the FlowSchema and the priority level, from the response headers.
type classification struct{ flowSchema, priorityLevel types.UID }

// classifyAs sends a request as user (impersonated by the admin: the user
// name and the groups of a ServiceAccount's token) and returns its
// classification. The request need not succeed.
func classifyAs(t *testing.T, user, method, path string) classification {
	t.Helper()
	cfg := rest.CopyConfig(restConfig)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(method, strings.TrimSuffix(cfg.Host, "/")+path, strings.NewReader(`{"metadata":{"labels":{"probe":"x"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/merge-patch+json")
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	_ = resp.Body.Close()
	return classification{
		flowSchema:    types.UID(resp.Header.Get(flowcontrolv1.ResponseHeaderMatchedFlowSchemaUID)),
		priorityLevel: types.UID(resp.Header.Get(flowcontrolv1.ResponseHeaderMatchedPriorityLevelConfigurationUID)),
	}
}
