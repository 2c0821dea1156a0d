package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/internal/localrun"
	"github.com/sharder-dev/sharder/internal/testenv"
	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// FlowControlInput configures FlowControlSpec.
type FlowControlInput struct {
	// Objects is the number of ConfigMaps in the ring.
	Objects int
	// SharedLevel leaves the chart's FlowSchemas out: one FlowSchema puts
	// every request of the sharder's and the instances' ServiceAccounts
	// into the small level instead, as Kubernetes' own FlowSchemas put them
	// all into workload-low, here as busy as that level. Default: false,
	// the chart's FlowSchemas.
	SharedLevel bool
	// Timeout bounds each wait.
	Timeout time.Duration
}

// FlowControlSpec: the sharder and three instances (the plain controller
// beside `sharder agent`) run as ordinary ServiceAccounts, not as members
// of system:masters, which API Priority and Fairness exempts. The chart's
// FlowSchemas are installed with the sharder's writes limited to a
// priority level of three seats (one nominal share, nothing lent or
// borrowed). The API server classifies the sharder's Lease requests with
// its label patches before, and at the leader-election level after; a
// fourth instance joins, and the rebalance of the objects through the
// small level finishes without any instance or the leader losing its
// Lease.
func FlowControlSpec(t *testing.T, in FlowControlInput) {
	e := newRingEnv(t, ringOptions{
		Resources:       []sharderv1alpha1.RingResource{{Group: "", Resource: "configmaps"}},
		Watched:         corev1.SchemeGroupVersion.WithResource("configmaps"),
		TrackedKind:     schema.GroupKind{Kind: "ConfigMap"},
		ServiceAccounts: true,
		// Long enough that only queueing in the API server, not a loaded
		// machine, could cost a Lease.
		LeaseDuration:       6 * time.Second,
		LeaderLeaseDuration: 8 * time.Second,
	})
	g := e.g
	leaderLease := "/apis/coordination.k8s.io/v1/namespaces/" + e.sharderNamespace + "/leases/" + e.ring
	objectPatch := "/api/v1/namespaces/" + e.namespace + "/configmaps/probe?dryRun=All"
	instanceLease := "/apis/coordination.k8s.io/v1/namespaces/" + e.leaseNamespace + "/leases/instance-0"
	before := classify(t, e.sharderUser, http.MethodPatch, objectPatch)
	g.Expect(before.flowSchema).NotTo(gomega.BeEmpty(), "the API server runs priority and fairness")
	g.Expect(classify(t, e.sharderUser, http.MethodGet, leaderLease)).To(gomega.Equal(before),
		"as an ordinary ServiceAccount, the sharder's Lease requests share the flow of its label patches")

	level := e.installFlowControl(in.SharedLevel)
	leases, writes := e.ring+"-sharder-leases", e.ring+"-sharder-writes"
	if in.SharedLevel {
		leases, writes = e.ring+"-shared", e.ring+"-shared"
	}
	want := func(flowSchema, priorityLevel string) classification {
		var fs flowcontrolv1.FlowSchema
		var pl flowcontrolv1.PriorityLevelConfiguration
		g.Expect(e.c.Get(e.ctx, client.ObjectKey{Name: flowSchema}, &fs)).To(gomega.Succeed())
		g.Expect(e.c.Get(e.ctx, client.ObjectKey{Name: priorityLevel}, &pl)).To(gomega.Succeed())
		return classification{fs.UID, pl.UID}
	}
	leaseLevel := "leader-election"
	if in.SharedLevel {
		leaseLevel = level
	}
	g.Eventually(func() classification { return classify(t, e.sharderUser, http.MethodPatch, objectPatch) }).
		WithTimeout(in.Timeout).WithPolling(200 * time.Millisecond).Should(gomega.Equal(want(writes, level)))
	g.Eventually(func() classification { return classify(t, e.sharderUser, http.MethodGet, leaderLease) }).
		WithTimeout(in.Timeout).WithPolling(200 * time.Millisecond).Should(gomega.Equal(want(leases, leaseLevel)))
	g.Eventually(func() classification { return classify(t, e.instanceUser, http.MethodGet, instanceLease) }).
		WithTimeout(in.Timeout).WithPolling(200 * time.Millisecond).Should(gomega.Equal(want(leases, leaseLevel)))

	// Started together, they wait one lease duration for their Leases once.
	var procs [3][2]*localrun.Process
	for i := range procs {
		procs[i][0], procs[i][1] = e.launchPlainInstance(fmt.Sprintf("instance-%d", i))
	}
	for i, p := range procs {
		e.waitHeld(fmt.Sprintf("instance-%d", i), p[:]...)
	}
	e.startSharders()
	start := time.Now()
	e.createConfigMaps(in.Objects)
	e.waitSettled(in.Objects, in.Timeout)
	assigned := time.Since(start)

	transitions := map[string]int32{}
	for i := range 3 {
		id := fmt.Sprintf("instance-%d", i)
		transitions[id] = ptr.Deref(e.lease(id).Spec.LeaseTransitions, 0)
	}
	leader := e.leader()
	waitsBefore := flowControlWaits(t)

	// The ring changes once the new instance holds its Lease.
	e.startPlainInstance("instance-3")
	start = time.Now()
	e.waitSettled(in.Objects, in.Timeout, "instance-0", "instance-1", "instance-2", "instance-3")
	rebalanced := time.Since(start)
	waits := flowControlWaits(t).since(waitsBefore)

	lost := e.restartCounts()
	for id, n := range transitions {
		l := e.lease(id)
		if ptr.Deref(l.Spec.HolderIdentity, "") != id || ptr.Deref(l.Spec.LeaseTransitions, 0) != n {
			lost[id+" Lease"]++
		}
	}
	for _, s := range e.liveSharders() {
		if n := s.Restarts(); n > 0 {
			lost[s.Name] = n
		}
	}
	t.Logf("%d objects through %s (%g seats): assigned in %s, 3 → 4 instances rebalanced in %s; Leases lost or processes restarted: %v",
		in.Objects, level, nominalSeats(t, level), assigned.Round(time.Millisecond), rebalanced.Round(time.Millisecond), lost)
	t.Logf("during the rebalance: writes %s; Lease requests %s", waits.of(writes, level), waits.of(leases, leaseLevel))
	if !in.SharedLevel {
		g.Expect(lost).To(gomega.BeEmpty(), "no instance lost its Lease, no process restarted")
		g.Expect(localrun.IsLeader(leader)).To(gomega.BeTrue(), "the leader kept its leadership")
		g.Expect(waits.of(writes, level).dispatched).To(gomega.BeNumerically(">=", in.Objects/4),
			"the moves went through the sharder's level")
		// The writes queued for the small level; the Lease requests did not
		// queue behind them.
		g.Expect(waits.of(leases, leaseLevel).meanWait()).To(gomega.BeNumerically("<", waits.of(writes, level).meanWait()))
	}
}

func TestFlowControl(t *testing.T) {
	in := FlowControlInput{Objects: 400, Timeout: 3 * time.Minute}
	if n := os.Getenv("SHARDER_E2E_FLOWCONTROL_OBJECTS"); n != "" {
		objects, err := strconv.Atoi(n)
		if err != nil || objects < 1 {
			t.Fatalf("SHARDER_E2E_FLOWCONTROL_OBJECTS=%q: want a positive number of objects", n)
		}
		in.Objects, in.Timeout = objects, 3*time.Minute+time.Duration(objects)*20*time.Millisecond
	}
	FlowControlSpec(t, in)
	if os.Getenv("SHARDER_E2E_FLOWCONTROL_SHARED") != "" {
		// The comparison: the same run without the chart's FlowSchemas.
		t.Run("shared level", func(t *testing.T) { in.SharedLevel = true; FlowControlSpec(t, in) })
	}
}

// installFlowControl creates the chart's flow control objects (helm
// template) for the ring's ServiceAccounts, with the sharder's writes
// limited to one nominal share (three seats of the API server's 600) that
// lends and borrows nothing, and returns that level's name. With shared,
// it creates the level and one FlowSchema that sends every request of the
// sharder and the instances there instead.
func (e *ringEnv) installFlowControl(shared bool) string {
	e.t.Helper()
	g := e.g
	values := fmt.Sprintf(`
fullnameOverride: %s-sharder
serviceAccount: {name: %s}
flowControl:
  instanceServiceAccounts:
  - {namespace: %s, name: %s}
  writes:
    nominalConcurrencyShares: 1
    lendablePercent: 0
`, e.ring, sharderAccount, e.leaseNamespace, instanceAccount)
	root, err := testenv.RepoRoot()
	g.Expect(err).NotTo(gomega.HaveOccurred())
	file := filepath.Join(e.t.TempDir(), "values.yaml")
	g.Expect(os.WriteFile(file, []byte(values), 0o600)).To(gomega.Succeed())
	dc, err := discovery.NewDiscoveryClientForConfig(cluster.ControlPlane.Config)
	g.Expect(err).NotTo(gomega.HaveOccurred())
	version, err := dc.ServerVersion()
	g.Expect(err).NotTo(gomega.HaveOccurred())
	cmd := exec.Command(filepath.Join(root, "bin", "helm"), "template", "sharder", filepath.Join(root, "charts", "sharder"),
		"--namespace", e.sharderNamespace, "--kube-version", version.GitVersion,
		"--show-only", "templates/flowcontrol.yaml", "--values", file)
	out, err := cmd.CombinedOutput()
	g.Expect(err).NotTo(gomega.HaveOccurred(), "helm template (make e2e installs bin/helm): %s", out)
	objs, err := testenv.DecodeObjects(out)
	g.Expect(err).NotTo(gomega.HaveOccurred())

	var level string
	var create []*unstructured.Unstructured
	for _, o := range objs {
		switch o.GetKind() {
		case "PriorityLevelConfiguration":
			level = o.GetName()
			g.Expect(unstructured.SetNestedField(o.Object, int64(0), "spec", "limited", "borrowingLimitPercent")).To(gomega.Succeed())
			create = append(create, o)
		case "FlowSchema":
			if !shared {
				create = append(create, o)
			}
		}
	}
	g.Expect(level).NotTo(gomega.BeEmpty())
	if shared {
		fs := &flowcontrolv1.FlowSchema{
			ObjectMeta: metav1.ObjectMeta{Name: e.ring + "-shared"},
			Spec: flowcontrolv1.FlowSchemaSpec{
				PriorityLevelConfiguration: flowcontrolv1.PriorityLevelConfigurationReference{Name: level},
				MatchingPrecedence:         800,
				DistinguisherMethod:        &flowcontrolv1.FlowDistinguisherMethod{Type: flowcontrolv1.FlowDistinguisherMethodByUserType},
				Rules: []flowcontrolv1.PolicyRulesWithSubjects{{
					Subjects: []flowcontrolv1.Subject{
						accountSubject(e.sharderNamespace, sharderAccount), accountSubject(e.leaseNamespace, instanceAccount),
					},
					ResourceRules: []flowcontrolv1.ResourcePolicyRule{{
						APIGroups: []string{"*"}, Resources: []string{"*"}, Verbs: []string{"*"},
						Namespaces: []string{"*"}, ClusterScope: true,
					}},
				}},
			},
		}
		u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(fs)
		g.Expect(err).NotTo(gomega.HaveOccurred())
		o := &unstructured.Unstructured{Object: u}
		o.SetGroupVersionKind(flowcontrolv1.SchemeGroupVersion.WithKind("FlowSchema"))
		create = append(create, o)
	}
	for _, o := range create {
		g.Expect(e.c.Create(e.ctx, o)).To(gomega.Succeed())
		e.t.Cleanup(func() { _ = e.c.Delete(context.Background(), o) })
	}
	return level
}

func accountSubject(namespace, name string) flowcontrolv1.Subject {
	return flowcontrolv1.Subject{Kind: flowcontrolv1.SubjectKindServiceAccount,
		ServiceAccount: &flowcontrolv1.ServiceAccountSubject{Namespace: namespace, Name: name}}
}

// createConfigMaps creates n ConfigMaps obj-<i> in the ring's namespace,
// as the administrator, eight at a time.
func (e *ringEnv) createConfigMaps(n int) {
	e.t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	next := make(chan int)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: e.namespace, Name: fmt.Sprintf("obj-%05d", i)}}
				if err := e.c.Create(e.ctx, cm); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	for err := range errs {
		e.t.Fatalf("creating ConfigMaps: %v", err)
	}
}

// classification is where API Priority and Fairness put a request: the
// UIDs of the FlowSchema and the priority level, from the response headers.
type classification struct{ flowSchema, priorityLevel types.UID }

// classify sends a request as user and returns its classification. The
// request need not succeed.
func classify(t *testing.T, user *localrun.User, method, path string) classification {
	t.Helper()
	httpClient, err := rest.HTTPClientFor(user.Config)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(method, strings.TrimSuffix(user.Config.Host, "/")+path, strings.NewReader(`{"metadata":{"labels":{"probe":"x"}}}`))
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

// flowWait is what the API server's metrics say of the requests of one
// FlowSchema and priority level.
type flowWait struct {
	dispatched float64 // requests executed
	waitSum    float64 // seconds they waited in the queue, in total
	waitCount  float64
	rejected   float64 // requests refused (queue full, or waited too long)
	flowSchema string
	level      string
}

// meanWait is how long the requests waited in the queue, on average.
func (w flowWait) meanWait() time.Duration {
	if w.waitCount == 0 {
		return 0
	}
	return time.Duration(w.waitSum / w.waitCount * float64(time.Second))
}

func (w flowWait) String() string {
	return fmt.Sprintf("(%s at %s): %g dispatched, %g rejected, mean queue wait %s", w.flowSchema, w.level, w.dispatched,
		w.rejected, w.meanWait().Round(100*time.Microsecond))
}

type flowWaits map[[2]string]flowWait

func (w flowWaits) of(flowSchema, level string) flowWait {
	v := w[[2]string{flowSchema, level}]
	v.flowSchema, v.level = flowSchema, level
	return v
}

// since returns the differences of the counters from before.
func (w flowWaits) since(before flowWaits) flowWaits {
	out := flowWaits{}
	for k, v := range w {
		b := before[k]
		out[k] = flowWait{dispatched: v.dispatched - b.dispatched, waitSum: v.waitSum - b.waitSum,
			waitCount: v.waitCount - b.waitCount, rejected: v.rejected - b.rejected}
	}
	return out
}

var sampleRE = regexp.MustCompile(`^(apiserver_flowcontrol_[a-z_]+)\{([^}]*)\} (\S+)$`)

// apiServerMetrics returns the samples of the API server's metrics whose
// names start with apiserver_flowcontrol_.
func apiServerMetrics(t *testing.T) []sample {
	t.Helper()
	cfg := cluster.ControlPlane.Config
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := httpClient.Get(strings.TrimSuffix(cfg.Host, "/") + "/metrics")
	if err != nil {
		t.Fatalf("reading the API server's metrics: %v", err)
	}
	defer func() { _ = resp.Body.Close() }()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(resp.Body); err != nil {
		t.Fatalf("reading the API server's metrics: %v", err)
	}
	var out []sample
	scanner := bufio.NewScanner(&buf)
	scanner.Buffer(make([]byte, 1<<20), 1<<20)
	for scanner.Scan() {
		m := sampleRE.FindStringSubmatch(scanner.Text())
		if m == nil {
			continue
		}
		v, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			continue
		}
		labels := map[string]string{}
		for _, kv := range strings.Split(m[2], ",") {
			k, val, _ := strings.Cut(kv, "=")
			labels[k] = strings.Trim(val, `"`)
		}
		out = append(out, sample{name: m[1], labels: labels, value: v})
	}
	return out
}

type sample struct {
	name   string
	labels map[string]string
	value  float64
}

// flowControlWaits sums the API server's counters per FlowSchema and
// priority level.
func flowControlWaits(t *testing.T) flowWaits {
	t.Helper()
	out := flowWaits{}
	for _, s := range apiServerMetrics(t) {
		k := [2]string{s.labels["flow_schema"], s.labels["priority_level"]}
		w := out[k]
		switch s.name {
		case "apiserver_flowcontrol_dispatched_requests_total":
			w.dispatched += s.value
		case "apiserver_flowcontrol_rejected_requests_total":
			w.rejected += s.value
		case "apiserver_flowcontrol_request_wait_duration_seconds_sum":
			w.waitSum += s.value
		case "apiserver_flowcontrol_request_wait_duration_seconds_count":
			w.waitCount += s.value
		default:
			continue
		}
		out[k] = w
	}
	return out
}

// nominalSeats is the API server's concurrency limit of a priority level.
func nominalSeats(t *testing.T, level string) float64 {
	t.Helper()
	for _, s := range apiServerMetrics(t) {
		if s.name == "apiserver_flowcontrol_nominal_limit_seats" && s.labels["priority_level"] == level {
			return s.value
		}
	}
	return 0
}
