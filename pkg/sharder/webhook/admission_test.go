package webhook_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/internal/testenv"
	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/ring"
	"github.com/sharder-dev/sharder/pkg/sharder/assign"
	"github.com/sharder-dev/sharder/pkg/sharder/leasecontroller"
	"github.com/sharder-dev/sharder/pkg/sharder/metrics"
	"github.com/sharder-dev/sharder/pkg/sharder/ringbuilds"
	"github.com/sharder-dev/sharder/pkg/sharder/webhook"
)

// admissionMode puts a ring in admission mode and limits it to ns.
func admissionMode(ns string) func(*v1alpha1.ControllerRing) {
	return func(r *v1alpha1.ControllerRing) {
		r.Spec.Assignment = &v1alpha1.RingAssignment{Mode: v1alpha1.AssignmentAdmission}
		r.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{v1alpha1.LabelNamespaceName: ns}}
	}
}

// startAssignment runs the sharder's assignment and lease controllers, as
// the elected leader would, until the test ends.
func startAssignment(t testing.TB) {
	t.Helper()
	mgrOpts := env().ManagerOptions()
	mgrOpts.Cache = cache.Options{ByObject: leasecontroller.CacheByObject()}
	mgr := env().NewManager(t, configAs(t, sharderUser), mgrOpts)
	reg := leasecontroller.NewRegistry()
	c, err := assign.New(assign.Options{Registry: reg, StatusInterval: ptr.To(100 * time.Millisecond), EventRecorder: &record.FakeRecorder{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	lc, err := leasecontroller.New(leasecontroller.Options{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	if err := lc.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	testenv.StartManager(t, mgr)
}

// assignCalls is how many requests of ring the assigning handler answered.
func assignCalls(ring string) float64 {
	ch := make(chan prometheus.Metric, 64)
	go func() { metrics.WebhookAssignmentsTotal.Collect(ch); close(ch) }()
	total := 0.0
	for m := range ch {
		d := &dto.Metric{}
		if err := m.Write(d); err != nil {
			continue
		}
		for _, l := range d.GetLabel() {
			if l.GetName() == metrics.LabelRing && l.GetValue() == ring {
				total += d.GetCounter().GetValue()
			}
		}
	}
	return total
}

// instanceOf is the instance the ring over ready picks for a ConfigMap.
func instanceOf(t testing.TB, ready []string, ns, name string) string {
	t.Helper()
	members := make([]membership.Member, 0, len(ready))
	for _, id := range ready {
		members = append(members, membership.Member{ID: id, State: membership.StateReady})
	}
	rm, _ := ringbuilds.ReadyMembers(v1alpha1.DefaultAlgorithm, v1alpha1.DefaultVirtualNodes, members)
	r, err := ring.New(v1alpha1.DefaultAlgorithm, rm)
	if err != nil {
		t.Fatal(err)
	}
	instance, err := r.Lookup(ring.ObjectKey("", "ConfigMap", ns, name))
	if err != nil {
		t.Fatal(err)
	}
	return instance
}

// waitAssigning waits until a create in ns comes back with ring's shard
// label: the mutating configuration is written and loaded.
func waitAssigning(t testing.TB, c client.Client, ring, ns string) {
	t.Helper()
	NewWithT(t).Eventually(func(g Gomega) {
		probe := labelled(ns, "probe", nil)
		g.Expect(c.Create(context.Background(), probe, client.DryRunAll)).To(Succeed())
		g.Expect(probe.Labels).To(HaveKey(v1alpha1.ShardLabel(ring)))
	}).WithTimeout(30 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())
}

// TestAdmissionAssignsAtCreate: in admission mode the create response
// already carries the shard label the sharder would write, the sharder
// writes nothing more, and only creates of the ring's resources in the
// ring's namespaces reach the assigning webhook.
func TestAdmissionAssignsAtCreate(t *testing.T) {
	ctx := context.Background()
	g := NewWithT(t)
	ns, outside := env().Namespace(t), env().Namespace(t)
	r := createRing(t, ns, admissionMode(ns))
	shard := v1alpha1.ShardLabel(r.Name)
	sharderClient, alice := clientAs(t, sharderUser), clientAs(t, userAlice)
	ready := []string{"inst-a", "inst-b"}
	for _, id := range ready {
		createLease(t, sharderClient, ns, r.Name, id, time.Now(), time.Hour)
	}
	startSharder(t, webhook.Options{})
	startAssignment(t)
	waitAssigning(t, alice, r.Name, ns)

	// Main objects: labelled in the response, by the ring's choice.
	const n = 20
	created := map[string]string{} // name -> resourceVersion
	for i := range n {
		cm := labelled(ns, "cm-"+strconv.Itoa(i), map[string]string{"app": "web"})
		g.Expect(alice.Create(ctx, cm)).To(Succeed())
		g.Expect(cm.Labels).To(HaveKeyWithValue(shard, instanceOf(t, ready, ns, cm.Name)), "the create response carries the label")
		g.Expect(cm.Labels).To(HaveKeyWithValue("app", "web"))
		created[cm.Name] = cm.ResourceVersion
	}

	// A main object whose name the API server has yet to generate has no
	// place on the ring yet: it is left to the sharder.
	generated := labelled(ns, "", nil)
	generated.GenerateName = "generated-"
	g.Expect(alice.Create(ctx, generated)).To(Succeed())
	g.Expect(generated.Labels).NotTo(HaveKey(shard))

	// A controlled object follows its controller.
	owner := &corev1.ConfigMap{}
	g.Expect(alice.Get(ctx, types.NamespacedName{Namespace: ns, Name: "cm-0"}, owner)).To(Succeed())
	child := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "child", Namespace: ns, OwnerReferences: []metav1.OwnerReference{{
		APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID, Controller: ptr.To(true)}}}}
	g.Expect(alice.Create(ctx, child)).To(Succeed())
	g.Expect(child.Labels).To(HaveKeyWithValue(shard, owner.Labels[shard]))
	// One whose controller does not exist is left unlabelled, not guessed.
	orphan := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "orphan", Namespace: ns, OwnerReferences: []metav1.OwnerReference{{
		APIVersion: "v1", Kind: "ConfigMap", Name: "missing", UID: "0000", Controller: ptr.To(true)}}}}
	g.Expect(alice.Create(ctx, orphan)).To(Succeed())
	g.Expect(orphan.Labels).NotTo(HaveKey(shard))

	// The sharder sees every object already where it belongs: once it has
	// counted them all as assigned, none was written again.
	assignedBefore := testutil.ToFloat64(metrics.AssignmentsTotal.WithLabelValues(r.Name))
	g.Eventually(func(g Gomega) {
		g.Expect(env().Client.Get(ctx, client.ObjectKeyFromObject(r), r)).To(Succeed())
		g.Expect(r.Status.AvailableInstances).To(BeEquivalentTo(2))
		g.Expect(r.Status.Objects).To(BeNumerically(">=", n))
		g.Expect(r.Status.UnassignedObjects).To(BeZero())
	}).WithTimeout(30 * time.Second).Should(Succeed())
	for name, rv := range created {
		cm := &corev1.ConfigMap{}
		g.Expect(env().Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, cm)).To(Succeed())
		g.Expect(cm.ResourceVersion).To(Equal(rv), "ConfigMap %s was written after its create", name)
	}
	cur := &corev1.Secret{}
	g.Expect(env().Client.Get(ctx, client.ObjectKeyFromObject(child), cur)).To(Succeed())
	g.Expect(cur.ResourceVersion).To(Equal(child.ResourceVersion), "the controlled Secret was written after its create")
	g.Expect(testutil.ToFloat64(metrics.AssignmentsTotal.WithLabelValues(r.Name))).To(Equal(assignedBefore))

	// Writes that are not a create of the ring's resources in the ring's
	// namespaces never reach the assigning webhook.
	calls := assignCalls(r.Name)
	cm := &corev1.ConfigMap{}
	g.Expect(alice.Get(ctx, types.NamespacedName{Namespace: ns, Name: "cm-1"}, cm)).To(Succeed())
	cm.Data = map[string]string{"k": "changed"}
	g.Expect(alice.Update(ctx, cm)).To(Succeed())
	g.Expect(alice.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "not-of-the-ring", Namespace: ns}})).To(Succeed())
	elsewhere := labelled(outside, "elsewhere", nil)
	g.Expect(alice.Create(ctx, elsewhere)).To(Succeed())
	g.Expect(elsewhere.Labels).NotTo(HaveKey(shard))
	g.Expect(alice.Delete(ctx, cm)).To(Succeed())
	g.Expect(assignCalls(r.Name)).To(Equal(calls))

	// A create carrying the label is the validating webhook's: the right
	// instance passes, one that is not a ready instance is denied.
	right := labelled(ns, "right", map[string]string{shard: instanceOf(t, ready, ns, "right")})
	g.Expect(alice.Create(ctx, right)).To(Succeed())
	expectDenied(g, alice.Create(ctx, labelled(ns, "wrong", map[string]string{shard: "inst-unknown"})), "is set by the sharder")
	g.Expect(assignCalls(r.Name)).To(Equal(calls))
}

// TestAdmissionWithoutReadyInstance: with no ready instance the object is
// created unlabelled, and the sharder assigns it once an instance is ready.
func TestAdmissionWithoutReadyInstance(t *testing.T) {
	ctx := context.Background()
	g := NewWithT(t)
	ns := env().Namespace(t)
	r := createRing(t, ns, admissionMode(ns))
	shard := v1alpha1.ShardLabel(r.Name)
	alice := clientAs(t, userAlice)
	startSharder(t, webhook.Options{})
	startAssignment(t)

	// The webhook answers (it is called) but has no instance to give.
	var cm *corev1.ConfigMap
	attempt := 0
	g.Eventually(func(g Gomega) {
		attempt++
		cm = labelled(ns, "early-"+strconv.Itoa(attempt), nil)
		before := assignCalls(r.Name)
		g.Expect(alice.Create(ctx, cm)).To(Succeed())
		g.Expect(assignCalls(r.Name)).To(BeNumerically(">", before), "the assigning webhook is not active yet")
	}).WithTimeout(30 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())
	g.Expect(cm.Labels).NotTo(HaveKey(shard))
	g.Expect(testutil.ToFloat64(metrics.WebhookAssignmentsTotal.WithLabelValues(r.Name, metrics.WebhookSkipped, "unplaced"))).To(BeNumerically(">=", 1))

	createLease(t, clientAs(t, sharderUser), ns, r.Name, "inst-a", time.Now(), time.Hour)
	g.Eventually(func(g Gomega) {
		g.Expect(alice.Get(ctx, client.ObjectKeyFromObject(cm), cm)).To(Succeed())
		g.Expect(cm.Labels).To(HaveKeyWithValue(shard, "inst-a"))
	}).WithTimeout(30 * time.Second).Should(Succeed())
}

// TestMutatingConfigurationFollowsRings: the MutatingWebhookConfiguration
// exists exactly while a ring is in admission mode, and a ring in watch mode
// gets creates back unlabelled as before.
func TestMutatingConfigurationFollowsRings(t *testing.T) {
	ctx := context.Background()
	g := NewWithT(t)
	ns := env().Namespace(t)
	r := createRing(t, ns, func(r *v1alpha1.ControllerRing) {
		r.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{v1alpha1.LabelNamespaceName: ns}}
	})
	createLease(t, clientAs(t, sharderUser), ns, r.Name, "inst-a", time.Now(), time.Hour)
	s := startSharder(t, webhook.Options{})
	waitProtected(t, r.Name, ns)
	mutating := func() (*admissionregistrationv1.MutatingWebhookConfiguration, error) {
		c := &admissionregistrationv1.MutatingWebhookConfiguration{}
		return c, env().Client.Get(ctx, types.NamespacedName{Name: s.opts.ConfigurationName}, c)
	}
	_, err := mutating()
	g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "watch mode writes no mutating configuration: %v", err)
	alice := clientAs(t, userAlice)
	cm := labelled(ns, "by-watch", nil)
	g.Expect(alice.Create(ctx, cm)).To(Succeed())
	g.Expect(cm.Labels).NotTo(HaveKey(v1alpha1.ShardLabel(r.Name)))

	set := func(mode string) {
		g.Eventually(func() error {
			if err := env().Client.Get(ctx, client.ObjectKeyFromObject(r), r); err != nil {
				return err
			}
			r.Spec.Assignment = &v1alpha1.RingAssignment{Mode: mode}
			return env().Client.Update(ctx, r)
		}).Should(Succeed())
	}
	set(v1alpha1.AssignmentAdmission)
	g.Eventually(func(g Gomega) {
		c, err := mutating()
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(c.Webhooks).To(HaveLen(1))
		g.Expect(c.Webhooks[0].Name).To(Equal(webhook.AssignWebhookName(r.Name)))
		g.Expect(c.Webhooks[0].ClientConfig.CABundle).NotTo(BeEmpty())
	}).Should(Succeed())
	waitAssigning(t, alice, r.Name, ns)

	set(v1alpha1.AssignmentWatch)
	g.Eventually(func() bool { _, err := mutating(); return apierrors.IsNotFound(err) }).Should(BeTrue())
	// The validating configuration stays.
	g.Expect(env().Client.Get(ctx, types.NamespacedName{Name: s.opts.ConfigurationName}, &admissionregistrationv1.ValidatingWebhookConfiguration{})).To(Succeed())
}
