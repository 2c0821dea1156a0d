package app

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/spf13/cobra"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// statusFixture creates a ring over ConfigMaps (controlling Secrets) in its
// own namespace, with three instance Leases and labelled objects, as the
// sharder would have left them. It returns the ring's name.
func statusFixture(t *testing.T) (ring, ns string) {
	t.Helper()
	g := NewWithT(t)
	ctx := context.Background()
	ns = env().Namespace(t)
	other := env().Namespace(t) // not selected by the ring
	ring = "status-" + ns

	cr := &v1alpha1.ControllerRing{
		ObjectMeta: metav1.ObjectMeta{Name: ring},
		Spec: v1alpha1.ControllerRingSpec{
			LeaseNamespace: ns,
			Resources: []v1alpha1.RingResource{{
				Resource:            "configmaps",
				ControlledResources: []metav1.GroupResource{{Resource: "secrets"}},
			}},
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{v1alpha1.LabelNamespaceName: ns}},
			VirtualNodes:      ptr.To[int32](100),
		},
	}
	g.Expect(env().Client.Create(ctx, cr)).To(Succeed())
	t.Cleanup(func() { _ = env().Client.Delete(context.Background(), cr) })

	ready := instanceLease(ns, ring, "instance-a")
	weighted := instanceLease(ns, ring, "instance-b")
	weighted.Labels[v1alpha1.LabelVirtualNodes] = "300"
	released := instanceLease(ns, ring, "instance-c")
	released.Spec.HolderIdentity = nil
	released.Labels[v1alpha1.LabelVirtualNodes] = "lots"
	foreign := instanceLease(other, ring, "instance-z") // outside the lease namespace: not a member
	for _, l := range []*coordinationv1.Lease{ready, weighted, released, foreign} {
		g.Expect(env().Client.Create(ctx, l)).To(Succeed())
	}

	shard, drain := v1alpha1.ShardLabel(ring), v1alpha1.DrainLabel(ring)
	objects := []struct {
		ns, name string
		labels   map[string]string
		secret   bool
	}{
		{ns, "a1", map[string]string{shard: "instance-a"}, false},
		{ns, "a2", map[string]string{shard: "instance-a", drain: "true"}, false},
		{ns, "a3", map[string]string{shard: "instance-a"}, false},
		{ns, "b1", map[string]string{shard: "instance-b"}, false},
		{ns, "c1", map[string]string{shard: "instance-c"}, false},
		{ns, "gone1", map[string]string{shard: "instance-gone"}, false},
		{ns, "new1", nil, false},
		{ns, "new2", map[string]string{"app": "x"}, false},
		{other, "elsewhere", nil, false}, // not in a selected namespace
		{other, "elsewhere-labelled", map[string]string{shard: "instance-a"}, false},
		{ns, "a1-child", map[string]string{shard: "instance-a"}, true},
		{ns, "b1-child", map[string]string{shard: "instance-b"}, true},
	}
	for _, o := range objects {
		meta := metav1.ObjectMeta{Namespace: o.ns, Name: o.name, Labels: o.labels}
		if o.secret {
			g.Expect(env().Client.Create(ctx, &corev1.Secret{ObjectMeta: meta})).To(Succeed())
		} else {
			g.Expect(env().Client.Create(ctx, &corev1.ConfigMap{ObjectMeta: meta})).To(Succeed())
		}
	}
	return ring, ns
}

func runStatus(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := NewStatusCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(append([]string{"--kubeconfig", kubeconfig(t)}, args...))
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

// rows returns name, state, weight and counts of each instance, with -1 for
// a count the report does not carry.
func rows(r RingReport) []row {
	out := make([]row, 0, len(r.Instances))
	for _, i := range r.Instances {
		out = append(out, row{i.Name, i.State, i.VirtualNodes, i.Objects, ptr.Deref(i.Controlled, -1), ptr.Deref(i.Drains, -1)})
	}
	return out
}

type row struct {
	Name                                      string
	State                                     string
	VirtualNodes, Objects, Controlled, Drains int
}

func decodeReport(g Gomega, out string) *StatusReport {
	report := &StatusReport{}
	g.Expect(json.Unmarshal([]byte(out), report)).To(Succeed(), out)
	return report
}

func TestStatusRecountJSON(t *testing.T) {
	g := NewWithT(t)
	ring, ns := statusFixture(t)

	out, err := runStatus(t, ring, "--recount", "-o", "json")
	g.Expect(err).NotTo(HaveOccurred(), out)
	report := decodeReport(g, out)
	g.Expect(report.Rings).To(HaveLen(1))
	r := report.Rings[0]
	g.Expect(r.Name).To(Equal(ring))
	g.Expect(r.Source).To(Equal("labels"))
	g.Expect(r.LeaseNamespace).To(Equal(ns))
	g.Expect(r.Algorithm).To(Equal(v1alpha1.AlgorithmConsistentHash))
	g.Expect(r.Ready).To(Equal("Unknown"), "no sharder ran: no condition")
	g.Expect(r.Stale).To(BeEmpty(), "counted from the labels: nothing is stale")
	g.Expect(r.Objects).To(Equal(8))
	g.Expect(r.Unassigned).To(Equal(2))
	g.Expect(r.Drains).To(Equal(1))
	g.Expect(r.ReadyInstances).To(Equal(2))
	g.Expect(r.ObjectsWithoutLease).To(Equal(1))
	g.Expect(r.Problems).To(BeEmpty())
	g.Expect(rows(r)).To(Equal([]row{
		{"instance-a", "ready", 100, 3, 1, 1},
		{"instance-b", "ready", 300, 1, 1, 0},
		{"instance-c", "dead", 100, 1, 0, 0},
		{"instance-gone", "no-lease", 0, 1, 0, 0},
	}))
	g.Expect(r.Instances[2].Note).To(ContainSubstring(v1alpha1.LabelVirtualNodes), "malformed weight is pointed out")
	g.Expect(r.Instances[2].Note).To(ContainSubstring("Lease released"))
	g.Expect(r.Instances[0].Holder).To(Equal("instance-a"))
	g.Expect(r.Instances[0].RenewTime).NotTo(BeNil())
}

func TestStatusRecountTableAndYAML(t *testing.T) {
	g := NewWithT(t)
	ring, ns := statusFixture(t)

	out, err := runStatus(t, ring, "--recount")
	g.Expect(err).NotTo(HaveOccurred(), out)
	lines := strings.Split(out, "\n")
	g.Expect(lines[0]).To(Equal("Ring " + ring + ": Ready=Unknown, consistent-hash, Leases in " + ns))
	g.Expect(lines[1]).To(Equal("  4 instances (2 ready), 8 objects, 2 unassigned, 1 drains in flight"))
	g.Expect(lines[2]).To(Equal("  source: the labels, counted just now (--recount)"))
	g.Expect(out).NotTo(ContainSubstring("stale"))
	g.Expect(out).To(MatchRegexp(`(?m)^\s+INSTANCE\s+STATE\s+WEIGHT\s+OBJECTS\s+SHARE\s+CONTROLLED\s+DRAINS\s+RENEWED\s+NOTE$`))
	g.Expect(out).To(MatchRegexp(`(?m)^\s+instance-a\s+ready\s+100\s+3\s+50\.0%\s+1\s+1\s+\S+ ago\s*$`))
	g.Expect(out).To(MatchRegexp(`(?m)^\s+instance-b\s+ready\s+300\s+1\s+16\.7%\s+1\s+0\s+\S+ ago\s*$`))
	g.Expect(out).To(MatchRegexp(`(?m)^\s+instance-c\s+dead\s+100\s+1\s+16\.7%\s+0\s+0\s+\S+ ago\s+Lease released; invalid sharder.dev/virtual-nodes label: "lots"`))
	g.Expect(out).To(MatchRegexp(`(?m)^\s+instance-gone\s+no-lease\s+-\s+1\s+16\.7%\s+0\s+0\s+-\s+objects are labelled`))

	out, err = runStatus(t, ring, "--recount", "--output=yaml")
	g.Expect(err).NotTo(HaveOccurred(), out)
	report := &StatusReport{}
	g.Expect(yaml.UnmarshalStrict([]byte(out), report)).To(Succeed(), out)
	g.Expect(report.Rings).To(HaveLen(1))
	g.Expect(report.Rings[0].Objects).To(Equal(8))
}

// writeRingStatus writes status to the ring as the sharder would, for the
// ring's current generation unless status says otherwise.
func writeRingStatus(t *testing.T, name string, status v1alpha1.ControllerRingStatus) {
	t.Helper()
	g := NewWithT(t)
	ctx := context.Background()
	ring := &v1alpha1.ControllerRing{}
	g.Expect(env().Client.Get(ctx, client.ObjectKey{Name: name}, ring)).To(Succeed())
	if status.ObservedGeneration == 0 {
		status.ObservedGeneration = ring.Generation
	}
	ring.Status = status
	g.Expect(env().Client.Status().Update(ctx, ring)).To(Succeed())
}

// fixtureStatus is a status for the fixture's ring whose counts differ from
// its labels, so that a report showing them was read from the status. It
// names a vanished instance without a Lease, and leaves out instance-b's
// Lease and the 5 objects labelled with an instance that is no member.
func fixtureStatus() v1alpha1.ControllerRingStatus {
	return v1alpha1.ControllerRingStatus{
		Conditions: []metav1.Condition{{
			Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonReady,
			Message: "Every resource of the ring is watched and at least one instance is ready.", LastTransitionTime: metav1.Now(),
		}},
		Instances:          3,
		AvailableInstances: 1,
		Objects:            1000,
		UnassignedObjects:  7,
		Drains:             3,
		Members: []v1alpha1.MemberStatus{
			{Name: "instance-a", State: "ready", VirtualNodes: 100, Objects: 900},
			{Name: "instance-c", State: "dead", VirtualNodes: 100, Objects: 8},
			{Name: "instance-v", State: "vanished", VirtualNodes: 100, Objects: 80},
		},
	}
}

// requestRecorder records the requests of a client, as "VERB path".
type requestRecorder struct {
	mu       sync.Mutex
	requests []string
}

func (r *requestRecorder) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
		r.mu.Lock()
		r.requests = append(r.requests, req.Method+" "+req.URL.Path)
		r.mu.Unlock()
		return rt.RoundTrip(req)
	})
}

// resourceRequests returns the recorded requests but discovery ("/api",
// "/apis", "/api/v1", "/apis/GROUP/VERSION").
func (r *requestRecorder) resourceRequests() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	discovery := regexp.MustCompile(`^GET /(api|apis|api/v1|apis/[^/]+/[^/]+)$`)
	var out []string
	for _, req := range r.requests {
		if !discovery.MatchString(req) {
			out = append(out, req)
		}
	}
	return out
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// TestStatusFromRingStatus: without --recount the report is the ring's
// status with the Leases' holders, read with one GET of the ring and one
// LIST of its Leases: no object, no namespace is listed.
func TestStatusFromRingStatus(t *testing.T) {
	g := NewWithT(t)
	ring, ns := statusFixture(t)
	writeRingStatus(t, ring, fixtureStatus())

	rec := &requestRecorder{}
	o := &statusOptions{output: outputJSON, now: time.Now, wrap: rec.wrap}
	o.cluster.kubeconfig = kubeconfig(t)
	var out bytes.Buffer
	g.Expect(o.run(context.Background(), &out, []string{ring})).To(Succeed())
	g.Expect(rec.resourceRequests()).To(Equal([]string{
		"GET /apis/sharder.dev/v1alpha1/controllerrings/" + ring,
		"GET /apis/coordination.k8s.io/v1/namespaces/" + ns + "/leases",
	}), "one GET of the ring, one LIST of its Leases")

	r := decodeReport(g, out.String()).Rings[0]
	g.Expect(r.Source).To(Equal("status"))
	g.Expect(r.Ready).To(Equal("True"))
	g.Expect(r.Reason).To(Equal(v1alpha1.ReasonReady))
	g.Expect(r.Generation).To(BeNumerically(">", 0))
	g.Expect(r.ObservedGeneration).To(Equal(r.Generation))
	g.Expect(r.Stale).To(BeEmpty())
	g.Expect(r.Problems).To(BeEmpty())
	g.Expect(r.Objects).To(Equal(1000))
	g.Expect(r.Unassigned).To(Equal(7))
	g.Expect(r.Drains).To(Equal(3))
	g.Expect(r.ObjectsWithoutLease).To(Equal(5))
	g.Expect(r.ReadyInstances).To(Equal(2), "instance-a from the status, instance-b from its Lease")
	g.Expect(rows(r)).To(Equal([]row{
		{"instance-a", "ready", 100, 900, -1, -1},
		{"instance-b", "ready", 300, 0, -1, -1},
		{"instance-c", "dead", 100, 8, -1, -1},
		{"instance-v", "vanished", 100, 80, -1, -1},
	}))
	byName := map[string]InstanceReport{}
	for _, i := range r.Instances {
		byName[i.Name] = i
	}
	g.Expect(byName["instance-a"].Holder).To(Equal("instance-a"))
	g.Expect(byName["instance-a"].RenewTime).NotTo(BeNil())
	g.Expect(byName["instance-a"].Note).To(BeEmpty())
	g.Expect(byName["instance-b"].Note).To(ContainSubstring("not in the ring's status"))
	g.Expect(byName["instance-c"].Holder).To(BeEmpty())
	g.Expect(byName["instance-c"].Note).To(ContainSubstring("Lease released"))
	g.Expect(byName["instance-v"].RenewTime).To(BeNil())
	g.Expect(byName["instance-v"].Note).To(Equal("no Lease in the ring"))

	table, err := runStatus(t, ring)
	g.Expect(err).NotTo(HaveOccurred(), table)
	lines := strings.Split(table, "\n")
	g.Expect(lines[0]).To(Equal("Ring " + ring + ": Ready=True (Ready), consistent-hash, Leases in " + ns))
	g.Expect(lines[1]).To(Equal("  4 instances (2 ready), 1000 objects, 7 unassigned, 3 drains in flight"))
	g.Expect(lines[2]).To(Equal(fmt.Sprintf("  source: the ring's status (observed generation %d, ring generation %d)", r.Generation, r.Generation)))
	g.Expect(lines[3]).To(Equal("  5 objects are labelled with instances that have no Lease in the ring (--recount names them)"))
	g.Expect(table).NotTo(ContainSubstring("stale"))
	g.Expect(table).To(MatchRegexp(`(?m)^\s+INSTANCE\s+STATE\s+WEIGHT\s+OBJECTS\s+SHARE\s+RENEWED\s+NOTE$`))
	g.Expect(table).To(MatchRegexp(`(?m)^\s+instance-a\s+ready\s+100\s+900\s+90\.6%\s+\S+ ago\s*$`))
	g.Expect(table).To(MatchRegexp(`(?m)^\s+instance-v\s+vanished\s+100\s+80\s+8\.1%\s+-\s+no Lease in the ring$`))
}

// TestStatusAsReader runs the command as a user allowed to read
// ControllerRings and list the ring's Leases, and nothing else: the
// report needs no more; --recount needs namespaces and the resources.
func TestStatusAsReader(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ring, ns := statusFixture(t)
	writeRingStatus(t, ring, fixtureStatus())

	name := "status-reader-" + ns
	user, err := env().Environment.ControlPlane.AddUser(envtest.User{Name: name}, env().Config)
	g.Expect(err).NotTo(HaveOccurred())
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"controllerrings"}, Verbs: []string{"get", "list"}}},
	}
	leases := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{coordinationv1.GroupName}, Resources: []string{"leases"}, Verbs: []string{"list"}}},
	}
	subjects := []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: name}}
	objs := []client.Object{role, leases,
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name}, Subjects: subjects,
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Subjects: subjects,
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name}},
	}
	for _, obj := range objs {
		g.Expect(env().Client.Create(ctx, obj)).To(Succeed())
		t.Cleanup(func() { _ = env().Client.Delete(context.Background(), obj) })
	}
	data, err := user.KubeConfig()
	g.Expect(err).NotTo(HaveOccurred())
	path := filepath.Join(t.TempDir(), "kubeconfig")
	g.Expect(os.WriteFile(path, data, 0o600)).To(Succeed())

	run := func(args ...string) (string, error) {
		cmd := NewStatusCommand()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(append([]string{"--kubeconfig", path, ring, "-o", "json"}, args...))
		err := cmd.ExecuteContext(ctx)
		return out.String(), err
	}
	// RBAC bindings take effect at once, but the authorizer's cache may lag
	// a moment behind them.
	var out string
	g.Eventually(func() error { out, err = run(); return err }, 30*time.Second, 100*time.Millisecond).Should(Succeed())
	r := decodeReport(g, out).Rings[0]
	g.Expect(r.Problems).To(BeEmpty())
	g.Expect(r.Objects).To(Equal(1000))
	g.Expect(r.Instances).To(HaveLen(4))

	out, err = run("--recount")
	g.Expect(err).To(MatchError(ContainSubstring("listing namespaces")), out)

	// Without the Leases the status is still shown, and not judged by them.
	g.Expect(env().Client.Delete(ctx, objs[3])).To(Succeed())
	g.Eventually(func(g Gomega) {
		out, err := run()
		g.Expect(err).NotTo(HaveOccurred(), out)
		r = decodeReport(g, out).Rings[0]
		g.Expect(r.Problems).To(ConsistOf(ContainSubstring("listing the Leases of ring " + ring)))
	}, 30*time.Second, 100*time.Millisecond).Should(Succeed())
	g.Expect(r.Stale).To(BeEmpty())
	g.Expect(r.Objects).To(Equal(1000))
	g.Expect(rows(r)).To(Equal([]row{
		{"instance-a", "ready", 100, 900, -1, -1},
		{"instance-c", "dead", 100, 8, -1, -1},
		{"instance-v", "vanished", 100, 80, -1, -1},
	}))
}

// TestStatusStale: a report from a status the sharder has not kept up says
// so, and why.
func TestStatusStale(t *testing.T) {
	ctx := context.Background()

	t.Run("no status written", func(t *testing.T) {
		g := NewWithT(t)
		ring, _ := statusFixture(t)
		out, err := runStatus(t, ring, "-o", "json")
		g.Expect(err).NotTo(HaveOccurred(), out)
		r := decodeReport(g, out).Rings[0]
		g.Expect(r.ObservedGeneration).To(BeZero())
		g.Expect(r.Stale).To(ConsistOf(ContainSubstring("has not written the ring's status")))
		g.Expect(r.Objects).To(BeZero())
		g.Expect(rows(r)).To(Equal([]row{
			{"instance-a", "ready", 100, 0, -1, -1},
			{"instance-b", "ready", 300, 0, -1, -1},
			{"instance-c", "dead", 100, 0, -1, -1},
		}), "the Leases are still shown, with the state they say")
		for _, i := range r.Instances {
			g.Expect(i.Note).To(ContainSubstring("not in the ring's status"))
		}

		out, err = runStatus(t, ring)
		g.Expect(err).NotTo(HaveOccurred(), out)
		g.Expect(strings.Split(out, "\n")[1:6]).To(Equal([]string{
			"  3 instances (2 ready), objects not counted",
			"  source: the ring's status, not written yet",
			"  status may be stale: the sharder has not written the ring's status yet",
			"  the sharder may not be running: check its pods, or count from the labels with --recount",
			"",
		}))
	})

	t.Run("generation not observed", func(t *testing.T) {
		g := NewWithT(t)
		ring, _ := statusFixture(t)
		writeRingStatus(t, ring, fixtureStatus())
		cr := &v1alpha1.ControllerRing{}
		g.Expect(env().Client.Get(ctx, client.ObjectKey{Name: ring}, cr)).To(Succeed())
		observed := cr.Generation
		cr.Spec.VirtualNodes = ptr.To[int32](200)
		g.Expect(env().Client.Update(ctx, cr)).To(Succeed())
		g.Expect(cr.Generation).To(Equal(observed + 1))

		out, err := runStatus(t, ring, "-o", "json")
		g.Expect(err).NotTo(HaveOccurred(), out)
		r := decodeReport(g, out).Rings[0]
		g.Expect(r.ObservedGeneration).To(Equal(observed))
		g.Expect(r.Generation).To(Equal(observed + 1))
		g.Expect(r.Stale).To(ConsistOf(fmt.Sprintf("the status describes generation %d of the ring, which is at generation %d", observed, observed+1)))
		g.Expect(r.Objects).To(Equal(1000), "still the status's counts")
	})

	t.Run("ready instance with an expired Lease", func(t *testing.T) {
		g := NewWithT(t)
		ring, ns := statusFixture(t)
		old := instanceLease(ns, ring, "instance-old")
		old.Spec.LeaseDurationSeconds = ptr.To[int32](15)
		old.Spec.RenewTime = &metav1.MicroTime{Time: time.Now().Add(-time.Hour)}
		g.Expect(env().Client.Create(ctx, old)).To(Succeed())
		status := fixtureStatus()
		status.Members = append(status.Members, v1alpha1.MemberStatus{Name: "instance-old", State: "ready", VirtualNodes: 100})
		writeRingStatus(t, ring, status)

		out, err := runStatus(t, ring, "-o", "json")
		g.Expect(err).NotTo(HaveOccurred(), out)
		r := decodeReport(g, out).Rings[0]
		g.Expect(r.Stale).To(ConsistOf(MatchRegexp(`^the status says instance instance-old is ready, but its Lease was last renewed (59m|60m|61m) ago \(lease duration 15s\)$`)),
			"instance-a is ready in the status and its Lease is fresh: not stale")
	})
}

func TestStatusAllRings(t *testing.T) {
	g := NewWithT(t)
	first, _ := statusFixture(t)
	second, _ := statusFixture(t)

	out, err := runStatus(t, "-o", "json")
	g.Expect(err).NotTo(HaveOccurred(), out)
	report := &StatusReport{}
	g.Expect(json.Unmarshal([]byte(out), report)).To(Succeed())
	names := []string{}
	for _, r := range report.Rings {
		names = append(names, r.Name)
	}
	g.Expect(names).To(ContainElements(first, second))
	g.Expect(slices.IsSorted(names)).To(BeTrue(), "rings sorted by name: %v", names)
}

func TestStatusErrors(t *testing.T) {
	g := NewWithT(t)
	_, err := runStatus(t, "no-such-ring")
	g.Expect(err).To(MatchError(ContainSubstring(`ControllerRing "no-such-ring" not found`)))

	_, err = runStatus(t, "-o", "xml")
	g.Expect(err).To(MatchError(`invalid argument "xml" for "-o, --output" flag: must be table, json or yaml`))

	_, err = runStatus(t, "a", "b")
	g.Expect(err).To(HaveOccurred())
}

// TestStatusReportsUnservedResources: a ring naming a resource the API
// server does not serve still gets a report, with the problem named.
func TestStatusReportsUnservedResources(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := env().Namespace(t)
	ring := "unserved-" + ns
	cr := &v1alpha1.ControllerRing{
		ObjectMeta: metav1.ObjectMeta{Name: ring},
		Spec: v1alpha1.ControllerRingSpec{
			LeaseNamespace: ns,
			Resources: []v1alpha1.RingResource{
				{Group: "example.dev", Resource: "widgets"},
				{Resource: "configmaps"},
			},
		},
	}
	g.Expect(env().Client.Create(ctx, cr)).To(Succeed())
	t.Cleanup(func() { _ = env().Client.Delete(context.Background(), cr) })
	g.Expect(env().Client.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "one"}})).To(Succeed())

	out, err := runStatus(t, ring, "--recount", "-o", "json")
	g.Expect(err).NotTo(HaveOccurred(), out)
	report := &StatusReport{}
	g.Expect(json.Unmarshal([]byte(out), report)).To(Succeed())
	r := report.Rings[0]
	g.Expect(r.Problems).To(ConsistOf(ContainSubstring("widgets.example.dev")))
	g.Expect(r.Unassigned).To(BeNumerically(">=", 1), "the served resource is still counted")
}

func TestStatusTableWithoutRings(t *testing.T) {
	g := NewWithT(t)
	var out bytes.Buffer
	g.Expect(writeStatus(&out, outputTable, &StatusReport{Time: metav1.NewTime(time.Now())})).To(Succeed())
	g.Expect(out.String()).To(Equal("No ControllerRings found.\n"))
}

// TestCompletion checks shell completion is on: the completion command
// exists and ring names complete from the cluster.
func TestCompletion(t *testing.T) {
	g := NewWithT(t)
	ring, _ := statusFixture(t)

	root := NewRootCommand()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetArgs([]string{"completion", "bash"})
	g.Expect(root.Execute()).To(Succeed())
	g.Expect(out.String()).To(ContainSubstring("__start_sharder"))

	root = NewRootCommand()
	out.Reset()
	root.SetOut(&out)
	root.SetArgs([]string{cobra.ShellCompNoDescRequestCmd, "status", "--kubeconfig", kubeconfig(t), ""})
	g.Expect(root.Execute()).To(Succeed())
	g.Expect(strings.Split(out.String(), "\n")).To(ContainElement(ring))

	root = NewRootCommand()
	out.Reset()
	root.SetOut(&out)
	root.SetArgs([]string{cobra.ShellCompNoDescRequestCmd, "status", "-o", ""})
	g.Expect(root.Execute()).To(Succeed())
	g.Expect(out.String()).To(HavePrefix("table\njson\nyaml\n"))
}
