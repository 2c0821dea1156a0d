package app

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/spf13/cobra"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
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
	ns = env.Namespace(t)
	other := env.Namespace(t) // not selected by the ring
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
	g.Expect(env.Client.Create(ctx, cr)).To(Succeed())
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), cr) })

	ready := instanceLease(ns, ring, "instance-a")
	weighted := instanceLease(ns, ring, "instance-b")
	weighted.Labels[v1alpha1.LabelVirtualNodes] = "300"
	released := instanceLease(ns, ring, "instance-c")
	released.Spec.HolderIdentity = nil
	released.Labels[v1alpha1.LabelVirtualNodes] = "lots"
	foreign := instanceLease(other, ring, "instance-z") // outside the lease namespace: not a member
	for _, l := range []*coordinationv1.Lease{ready, weighted, released, foreign} {
		g.Expect(env.Client.Create(ctx, l)).To(Succeed())
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
			g.Expect(env.Client.Create(ctx, &corev1.Secret{ObjectMeta: meta})).To(Succeed())
		} else {
			g.Expect(env.Client.Create(ctx, &corev1.ConfigMap{ObjectMeta: meta})).To(Succeed())
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

func TestStatusJSON(t *testing.T) {
	g := NewWithT(t)
	ring, ns := statusFixture(t)

	out, err := runStatus(t, ring, "-o", "json")
	g.Expect(err).NotTo(HaveOccurred(), out)
	report := &StatusReport{}
	g.Expect(json.Unmarshal([]byte(out), report)).To(Succeed(), out)
	g.Expect(report.Rings).To(HaveLen(1))
	r := report.Rings[0]
	g.Expect(r.Name).To(Equal(ring))
	g.Expect(r.LeaseNamespace).To(Equal(ns))
	g.Expect(r.Algorithm).To(Equal(v1alpha1.AlgorithmConsistentHash))
	g.Expect(r.Ready).To(Equal("Unknown"), "no sharder ran: no condition")
	g.Expect(r.Objects).To(Equal(8))
	g.Expect(r.Unassigned).To(Equal(2))
	g.Expect(r.Drains).To(Equal(1))
	g.Expect(r.ReadyInstances).To(Equal(2))
	g.Expect(r.Problems).To(BeEmpty())

	type row struct {
		Name                                      string
		State                                     string
		VirtualNodes, Objects, Controlled, Drains int
	}
	rows := make([]row, 0, len(r.Instances))
	for _, i := range r.Instances {
		rows = append(rows, row{i.Name, i.State, i.VirtualNodes, i.Objects, i.Controlled, i.Drains})
	}
	g.Expect(rows).To(Equal([]row{
		{"instance-a", "ready", 100, 3, 1, 1},
		{"instance-b", "ready", 300, 1, 1, 0},
		{"instance-c", "dead", 100, 1, 0, 0},
		{"instance-gone", "no-lease", 0, 1, 0, 0},
	}))
	g.Expect(r.Instances[2].Note).To(ContainSubstring(v1alpha1.LabelVirtualNodes), "malformed weight is pointed out")
	g.Expect(r.Instances[0].Holder).To(Equal("instance-a"))
}

func TestStatusTableAndYAML(t *testing.T) {
	g := NewWithT(t)
	ring, ns := statusFixture(t)

	out, err := runStatus(t, ring)
	g.Expect(err).NotTo(HaveOccurred(), out)
	lines := strings.Split(out, "\n")
	g.Expect(lines[0]).To(Equal("Ring " + ring + ": Ready=Unknown, consistent-hash, Leases in " + ns))
	g.Expect(lines[1]).To(Equal("  4 instances (2 ready), 8 objects, 2 unassigned, 1 drains in flight"))
	g.Expect(out).To(MatchRegexp(`(?m)^\s+INSTANCE\s+STATE\s+WEIGHT\s+OBJECTS\s+SHARE\s+CONTROLLED\s+DRAINS\s+NOTE$`))
	g.Expect(out).To(MatchRegexp(`(?m)^\s+instance-a\s+ready\s+100\s+3\s+50\.0%\s+1\s+1\s*$`))
	g.Expect(out).To(MatchRegexp(`(?m)^\s+instance-b\s+ready\s+300\s+1\s+16\.7%\s+1\s+0\s*$`))
	g.Expect(out).To(MatchRegexp(`(?m)^\s+instance-c\s+dead\s+100\s+1\s+16\.7%\s+0\s+0\s+invalid sharder.dev/virtual-nodes label: "lots"`))
	g.Expect(out).To(MatchRegexp(`(?m)^\s+instance-gone\s+no-lease\s+-\s+1\s+16\.7%\s+0\s+0\s+objects are labelled`))

	out, err = runStatus(t, ring, "--output=yaml")
	g.Expect(err).NotTo(HaveOccurred(), out)
	report := &StatusReport{}
	g.Expect(yaml.UnmarshalStrict([]byte(out), report)).To(Succeed(), out)
	g.Expect(report.Rings).To(HaveLen(1))
	g.Expect(report.Rings[0].Objects).To(Equal(8))
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
	g.Expect(err).To(MatchError(ContainSubstring(`--output "xml"`)))

	_, err = runStatus(t, "a", "b")
	g.Expect(err).To(HaveOccurred())
}

// TestStatusReportsUnservedResources: a ring naming a resource the API
// server does not serve still gets a report, with the problem named.
func TestStatusReportsUnservedResources(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := env.Namespace(t)
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
	g.Expect(env.Client.Create(ctx, cr)).To(Succeed())
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), cr) })
	g.Expect(env.Client.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "one"}})).To(Succeed())

	out, err := runStatus(t, ring, "-o", "json")
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
