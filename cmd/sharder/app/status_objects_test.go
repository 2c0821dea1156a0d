package app

import (
	"bytes"
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// drainsFixture adds to statusFixture's ring a drain the sharder's field
// manager wrote (a moving to instance-b), an object released by a forced
// move, and Secrets: one controlled by an unassigned ConfigMap, one by a
// Deployment (not a resource of the ring) and one with no controller. It
// returns when the sharder's drain write was sent.
func drainsFixture(t *testing.T) (ring, ns string, drainWritten time.Time) {
	t.Helper()
	g := NewWithT(t)
	ctx := context.Background()
	ring, ns = statusFixture(t)
	shard, drain := v1alpha1.ShardLabel(ring), v1alpha1.DrainLabel(ring)

	moving := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "moving", Labels: map[string]string{shard: "instance-a"}}}
	g.Expect(env().Client.Create(ctx, moving)).To(Succeed())
	released := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "released", Labels: map[string]string{drain: "instance-b"}}}
	g.Expect(env().Client.Create(ctx, released)).To(Succeed())

	drainWritten = time.Now()
	patch := []byte(`{"metadata":{"labels":{"` + drain + `":"instance-b"}}}`)
	g.Expect(env().Client.Patch(ctx, moving, client.RawPatch(types.MergePatchType, patch), client.FieldOwner("sharder/leader-1"))).To(Succeed())

	// A drain whose start the sharder recorded on the object, two minutes
	// before the label was written (by a leader since replaced).
	recorded := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "recorded",
		Labels:      map[string]string{shard: "instance-b", drain: "instance-a"},
		Annotations: map[string]string{v1alpha1.DrainStartedAnnotation(ring): v1alpha1.FormatDrainStarted(drainWritten.Add(-2 * time.Minute))}}}
	g.Expect(env().Client.Create(ctx, recorded)).To(Succeed())

	owner := &corev1.ConfigMap{}
	g.Expect(env().Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "new1"}, owner)).To(Succeed())
	secrets := []*corev1.Secret{
		{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "new1-child", OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "v1", Kind: "ConfigMap", Name: "new1", UID: owner.UID, Controller: ptr.To(true)}}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "deployment-child", OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "apps/v1", Kind: "Deployment", Name: "web", UID: "0b0c1d8e-1f8e-4f5e-9a51-2b3c4d5e6f70", Controller: ptr.To(true)}}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "plain"}},
	}
	for _, s := range secrets {
		g.Expect(env().Client.Create(ctx, s)).To(Succeed())
	}
	return ring, ns, drainWritten
}

// TestStatusDrainsAndUnassigned: --drains lists each main object carrying
// the drain label with its instance, its target and when the label was
// written (the managedFields time of its writer); --unassigned lists the
// main objects without a shard label and the controlled objects without one
// whose controller is of the ring's resources. Objects outside the ring's
// namespaces are left out.
func TestStatusDrainsAndUnassigned(t *testing.T) {
	g := NewWithT(t)
	ring, ns, written := drainsFixture(t)

	out, err := runStatus(t, ring, "--drains", "--unassigned", "-o", "json")
	g.Expect(err).NotTo(HaveOccurred(), out)
	r := decodeReport(g, out).Rings[0]
	g.Expect(r.Problems).To(BeEmpty())
	g.Expect(r.DrainTimeout.Duration).To(Equal(v1alpha1.DefaultDrainTimeout * time.Second))

	type drainRow struct{ Name, Instance, Target string }
	var drains []drainRow
	for _, d := range r.DrainList {
		g.Expect(d.Resource).To(Equal("configmaps"))
		g.Expect(d.Namespace).To(Equal(ns))
		drains = append(drains, drainRow{d.Name, d.Instance, d.Target})
	}
	g.Expect(drains).To(Equal([]drainRow{
		{"a2", "instance-a", ""}, // drain label "true": no target
		{"moving", "instance-a", "instance-b"},
		{"recorded", "instance-b", "instance-a"},
		{"released", "", "instance-b"},
	}))
	moving := r.DrainList[1]
	g.Expect(moving.Manager).To(Equal("sharder/leader-1"))
	g.Expect(moving.Labelled).NotTo(BeNil())
	// managedFields times are whole seconds.
	g.Expect(moving.Labelled.Time).To(BeTemporally("~", written, 2*time.Second))
	g.Expect(moving.Started).To(BeNil(), "no start recorded on the object")
	recorded := r.DrainList[2]
	g.Expect(recorded.Started).NotTo(BeNil())
	g.Expect(recorded.Started.Time).To(BeTemporally("~", written.Add(-2*time.Minute), time.Second))
	g.Expect(r.DrainList[3].Labelled).NotTo(BeNil(), "the creator of an object created with the label owns it")

	type unassignedRow struct {
		Resource, Name, Controller string
		Released                   bool
	}
	var unassigned []unassignedRow
	for _, u := range r.UnassignedList {
		g.Expect(u.Namespace).To(Equal(ns))
		g.Expect(u.Created.IsZero()).To(BeFalse())
		unassigned = append(unassigned, unassignedRow{u.Resource, u.Name, u.Controller, u.Released})
	}
	g.Expect(unassigned).To(Equal([]unassignedRow{
		{"configmaps", "new1", "", false},
		{"configmaps", "new2", "", false},
		{"configmaps", "released", "", true},
		{"secrets", "new1-child", "ConfigMap new1", false},
	}))

	out, err = runStatus(t, ring, "-o", "yaml")
	g.Expect(err).NotTo(HaveOccurred(), out)
	g.Expect(out).NotTo(ContainSubstring("drainList"), "listed only when asked for")
	g.Expect(out).NotTo(ContainSubstring("unassignedList"))
	report := &StatusReport{}
	g.Expect(yaml.UnmarshalStrict([]byte(out), report)).To(Succeed(), out)
	g.Expect(report.Rings[0].DrainList).To(BeNil())
}

// TestStatusDrainsTable: the table names each drain's instance and target,
// how long ago its label was written, and points out a drain labelled
// longer ago than the ring's drainTimeout and a released object.
func TestStatusDrainsTable(t *testing.T) {
	g := NewWithT(t)
	ring, ns, written := drainsFixture(t)

	// managedFields times are truncated to the second: 2 s more keep every
	// age in the fifth minute.
	now := written.Add(5*time.Minute + 2*time.Second)
	o := &statusOptions{output: outputTable, drains: true, unassigned: true, now: func() time.Time { return now }}
	o.cluster.kubeconfig = kubeconfig(t)
	var buf bytes.Buffer
	g.Expect(o.run(context.Background(), &buf, []string{ring})).To(Succeed())
	out := buf.String()
	g.Expect(out).To(ContainSubstring("  Drains in flight (listed from the labels just now):\n"))
	g.Expect(out).To(MatchRegexp(`(?m)^\s+NAMESPACE\s+OBJECT\s+INSTANCE\s+TARGET\s+STARTED\s+LABELLED\s+NOTE$`))
	g.Expect(out).To(MatchRegexp(`(?m)^\s+` + ns + `\s+configmaps/a2\s+instance-a\s+-\s+-\s+5m\d*s? ago\s+no target: acknowledged by removing both labels; labelled longer ago than drainTimeout 30s, start not recorded`))
	g.Expect(out).To(MatchRegexp(`(?m)^\s+` + ns + `\s+configmaps/moving\s+instance-a\s+instance-b\s+-\s+5m\d*s? ago\s+` +
		`labelled longer ago than drainTimeout 30s, start not recorded: forced when the leader's own count ends$`))
	g.Expect(out).To(MatchRegexp(`(?m)^\s+` + ns + `\s+configmaps/recorded\s+instance-b\s+instance-a\s+7m\d*s? ago\s+5m\d*s? ago\s+` +
		`started longer ago than drainTimeout 30s: the leader forces it$`))
	g.Expect(out).To(MatchRegexp(`(?m)^\s+` + ns + `\s+configmaps/released\s+-\s+instance-b\s+-\s+5m\d*s? ago\s+released by a forced move: assigned after the release grace$`))
	g.Expect(out).To(ContainSubstring("  Unassigned objects (listed from the labels just now):\n"))
	g.Expect(out).To(MatchRegexp(`(?m)^\s+NAMESPACE\s+OBJECT\s+CREATED\s+NOTE$`))
	g.Expect(out).To(MatchRegexp(`(?m)^\s+` + ns + `\s+configmaps/new1\s+5m\d*s? ago\s*$`))
	g.Expect(out).To(MatchRegexp(`(?m)^\s+` + ns + `\s+configmaps/released\s+5m\d*s? ago\s+released by a forced move`))
	g.Expect(out).To(MatchRegexp(`(?m)^\s+` + ns + `\s+secrets/new1-child\s+5m\d*s? ago\s+follows its controller ConfigMap new1$`))
	g.Expect(out).NotTo(ContainSubstring("deployment-child"))
	g.Expect(out).NotTo(ContainSubstring("secrets/plain"))
	g.Expect(out).NotTo(ContainSubstring("elsewhere"), "not in the ring's namespaces")
}

// TestStatusNoDrains: a ring without drains or unassigned objects says so.
func TestStatusNoDrains(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := env().Namespace(t)
	ring := "quiet-" + ns
	cr := &v1alpha1.ControllerRing{
		ObjectMeta: metav1.ObjectMeta{Name: ring},
		Spec: v1alpha1.ControllerRingSpec{
			LeaseNamespace:    ns,
			Resources:         []v1alpha1.RingResource{{Resource: "configmaps"}},
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{v1alpha1.LabelNamespaceName: ns}},
		},
	}
	g.Expect(env().Client.Create(ctx, cr)).To(Succeed())
	t.Cleanup(func() { _ = env().Client.Delete(context.Background(), cr) })

	out, err := runStatus(t, ring, "--drains", "--unassigned")
	g.Expect(err).NotTo(HaveOccurred(), out)
	g.Expect(out).To(ContainSubstring("  No drains in flight (listed from the labels just now).\n"))
	g.Expect(out).To(ContainSubstring("  No unassigned objects (listed from the labels just now).\n"))

	out, err = runStatus(t, ring, "--drains", "--unassigned", "-o", "json")
	g.Expect(err).NotTo(HaveOccurred(), out)
	g.Expect(out).To(ContainSubstring(`"drainList": []`), "asked for and empty: an empty list, not a missing field")
	g.Expect(out).To(ContainSubstring(`"unassignedList": []`))
}
