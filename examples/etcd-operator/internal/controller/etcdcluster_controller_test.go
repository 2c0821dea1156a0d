package controller_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	etcdv1alpha1 "github.com/sharder-dev/sharder/examples/etcd-operator/api/v1alpha1"
	"github.com/sharder-dev/sharder/examples/etcd-operator/internal/controller"
)

func plainManager(t *testing.T, ns string) {
	t.Helper()
	startManager(t, controller.Options{}, inNamespace(ns))
}

func TestLifecycle(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ctx := context.Background()
	ns := env().Namespace(t)
	plainManager(t, ns)
	c := newCluster(ns, "lifecycle", 3)
	g.Expect(env().Client.Create(ctx, c)).To(Succeed())

	// Creating: finalizer, children with controller references, status.
	g.Eventually(getCluster(ctx, c), timeout, interval).Should(And(
		havePhase(etcdv1alpha1.EtcdClusterPhaseCreating),
		haveCondition(etcdv1alpha1.ConditionResourcesReady, metav1.ConditionTrue, etcdv1alpha1.ReasonReconciled),
		haveCondition(etcdv1alpha1.ConditionReady, metav1.ConditionFalse, etcdv1alpha1.ReasonMembersNotReady),
	))
	got := getCluster(ctx, c)(g)
	g.Expect(got.Finalizers).To(ContainElement(controller.Finalizer))
	g.Expect(got.Status.ObservedGeneration).To(Equal(got.Generation))
	g.Expect(got.Status.ReadyReplicas).To(BeZero())
	g.Expect(got.Status.Members).To(HaveLen(3))
	// The pod is not ready; etcd (a local one, see localEtcd) knows the
	// member and it answers.
	m0 := got.Status.Members[0]
	g.Expect(m0.ID).NotTo(BeEmpty())
	g.Expect(m0.Version).To(HavePrefix("3."), "the version the member reports")
	m0.ID, m0.Version = "", ""
	g.Expect(m0).To(Equal(etcdv1alpha1.EtcdMember{
		Name:      "lifecycle-0",
		PeerURL:   "http://lifecycle-0.lifecycle-peer." + ns + ".svc:2380",
		ClientURL: "http://lifecycle-0.lifecycle-peer." + ns + ".svc:2379",
		Healthy:   true,
	}))
	g.Expect(got.Status.ClusterID).NotTo(BeEmpty())
	g.Expect(got.Status.Leader).To(HavePrefix("lifecycle-"))
	g.Expect(got.Status.HealthyMembers).To(BeEquivalentTo(3))
	g.Expect(got.Status.ClientEndpoints).To(Equal([]string{"http://lifecycle-client." + ns + ".svc:2379"}))

	for _, obj := range objectsOf(got) {
		g.Eventually(func() error { return env().Client.Get(ctx, client.ObjectKeyFromObject(obj), obj) }, timeout, interval).Should(Succeed())
		ref := metav1.GetControllerOf(obj)
		g.Expect(ref).NotTo(BeNil(), "%T %s has no controller", obj, obj.GetName())
		g.Expect(ref.UID).To(Equal(got.UID))
		g.Expect(ref.Kind).To(Equal("EtcdCluster"))
		g.Expect(obj.GetLabels()).To(HaveKeyWithValue(controller.LabelCluster, "lifecycle"))
	}

	sts := &appsv1.StatefulSet{}
	g.Expect(env().Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "lifecycle"}, sts)).To(Succeed())
	g.Expect(*sts.Spec.Replicas).To(BeEquivalentTo(3))
	g.Expect(sts.Spec.ServiceName).To(Equal("lifecycle-peer"))
	g.Expect(sts.Spec.PodManagementPolicy).To(Equal(appsv1.ParallelPodManagement))
	g.Expect(sts.Spec.Template.Spec.Containers[0].Image).To(Equal(etcdv1alpha1.DefaultRepository + ":v" + etcdv1alpha1.DefaultVersion))
	g.Expect(sts.Spec.VolumeClaimTemplates[0].Spec.Resources.Requests.Storage().String()).To(Equal("10Gi"))

	peer := &corev1.Service{}
	g.Expect(env().Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "lifecycle-peer"}, peer)).To(Succeed())
	g.Expect(peer.Spec.ClusterIP).To(Equal(corev1.ClusterIPNone))
	g.Expect(peer.Spec.PublishNotReadyAddresses).To(BeTrue())

	// Members start when the operator lets them (membership gate) and
	// restart when it deletes them (OnDelete).
	g.Expect(sts.Spec.UpdateStrategy.Type).To(Equal(appsv1.OnDeleteStatefulSetStrategyType))
	g.Expect(sts.Spec.Template.Spec.SchedulingGates).To(ConsistOf(corev1.PodSchedulingGate{Name: "etcd.example.sharder.dev/membership"}))
	cm := &corev1.ConfigMap{}
	g.Expect(env().Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "lifecycle-config"}, cm)).To(Succeed())
	g.Expect(cm.Data).NotTo(HaveKey("ETCD_INITIAL_CLUSTER"), "the initial cluster is written on each member's pod")

	pdb := &policyv1.PodDisruptionBudget{}
	g.Expect(env().Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "lifecycle"}, pdb)).To(Succeed())
	g.Expect(*pdb.Spec.MinAvailable).To(Equal(intstr.FromInt32(2)))

	// No kubelet runs: without ready replicas the cluster stays Creating.
	g.Consistently(getCluster(ctx, c), time.Second, 100*time.Millisecond).Should(havePhase(etcdv1alpha1.EtcdClusterPhaseCreating))

	// A quorum is not enough to leave Creating.
	setReadyReplicas(ctx, g, ns, "lifecycle", 2)
	g.Eventually(getCluster(ctx, c), timeout, interval).Should(And(
		havePhase(etcdv1alpha1.EtcdClusterPhaseCreating),
		haveCondition(etcdv1alpha1.ConditionAvailable, metav1.ConditionTrue, etcdv1alpha1.ReasonQuorumReady),
		WithTransform(func(c *etcdv1alpha1.EtcdCluster) int32 { return c.Status.ReadyReplicas }, BeEquivalentTo(2)),
	))

	setReadyReplicas(ctx, g, ns, "lifecycle", 3)
	g.Eventually(getCluster(ctx, c), timeout, interval).Should(And(
		havePhase(etcdv1alpha1.EtcdClusterPhaseRunning),
		haveCondition(etcdv1alpha1.ConditionReady, metav1.ConditionTrue, etcdv1alpha1.ReasonMembersReady),
	))
	g.Eventually(eventReasons(ctx, c), timeout, interval).Should(ContainElements("Created", "Creating", "Running"))
}

func TestQuorumLossAndRecovery(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ctx := context.Background()
	ns := env().Namespace(t)
	plainManager(t, ns)
	c := newCluster(ns, "quorum", 3)
	g.Expect(env().Client.Create(ctx, c)).To(Succeed())
	g.Eventually(getCluster(ctx, c), timeout, interval).Should(havePhase(etcdv1alpha1.EtcdClusterPhaseCreating))

	setReadyReplicas(ctx, g, ns, "quorum", 3)
	g.Eventually(getCluster(ctx, c), timeout, interval).Should(havePhase(etcdv1alpha1.EtcdClusterPhaseRunning))

	// One member down: still Running, no longer Ready.
	setReadyReplicas(ctx, g, ns, "quorum", 2)
	g.Eventually(getCluster(ctx, c), timeout, interval).Should(And(
		havePhase(etcdv1alpha1.EtcdClusterPhaseRunning),
		haveCondition(etcdv1alpha1.ConditionReady, metav1.ConditionFalse, etcdv1alpha1.ReasonMembersNotReady),
		haveCondition(etcdv1alpha1.ConditionAvailable, metav1.ConditionTrue, etcdv1alpha1.ReasonQuorumReady),
	))

	// Two members down: the quorum is lost.
	setReadyReplicas(ctx, g, ns, "quorum", 1)
	g.Eventually(getCluster(ctx, c), timeout, interval).Should(And(
		havePhase(etcdv1alpha1.EtcdClusterPhaseFailed),
		haveCondition(etcdv1alpha1.ConditionReady, metav1.ConditionFalse, etcdv1alpha1.ReasonQuorumLost),
		haveCondition(etcdv1alpha1.ConditionAvailable, metav1.ConditionFalse, etcdv1alpha1.ReasonMembersNotReady),
	))

	// The quorum back: Running again without anyone touching the cluster.
	setReadyReplicas(ctx, g, ns, "quorum", 2)
	g.Eventually(getCluster(ctx, c), timeout, interval).Should(havePhase(etcdv1alpha1.EtcdClusterPhaseRunning))
	g.Eventually(eventReasons(ctx, c), timeout, interval).Should(ContainElements(etcdv1alpha1.ReasonQuorumLost, "Recovered"))
}

func TestConflictFailsAndRecovers(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ctx := context.Background()
	ns := env().Namespace(t)
	plainManager(t, ns)

	// Someone else's ConfigMap holds the name the cluster needs.
	foreign := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "conflict-config"},
		Data:       map[string]string{"owner": "someone else"},
	}
	g.Expect(env().Client.Create(ctx, foreign)).To(Succeed())
	c := newCluster(ns, "conflict", 1)
	g.Expect(env().Client.Create(ctx, c)).To(Succeed())

	g.Eventually(getCluster(ctx, c), timeout, interval).Should(And(
		havePhase(etcdv1alpha1.EtcdClusterPhaseFailed),
		haveCondition(etcdv1alpha1.ConditionResourcesReady, metav1.ConditionFalse, etcdv1alpha1.ReasonResourceConflict),
		haveCondition(etcdv1alpha1.ConditionReady, metav1.ConditionFalse, etcdv1alpha1.ReasonResourceConflict),
	))
	got := getCluster(ctx, c)(g)
	g.Expect(got.Status.Conditions).To(ContainElement(HaveField("Message", ContainSubstring("ConfigMap "+ns+"/conflict-config already exists"))))
	// The foreign object is left alone.
	g.Expect(env().Client.Get(ctx, client.ObjectKeyFromObject(foreign), foreign)).To(Succeed())
	g.Expect(foreign.Data).To(HaveKeyWithValue("owner", "someone else"))
	g.Expect(metav1.GetControllerOf(foreign)).To(BeNil())

	// Once it is gone, the operator recovers on its own.
	g.Expect(env().Client.Delete(ctx, foreign)).To(Succeed())
	g.Eventually(getCluster(ctx, c), timeout, interval).Should(And(
		havePhase(etcdv1alpha1.EtcdClusterPhaseCreating),
		haveCondition(etcdv1alpha1.ConditionResourcesReady, metav1.ConditionTrue, etcdv1alpha1.ReasonReconciled),
	))
	setReadyReplicas(ctx, g, ns, "conflict", 1)
	g.Eventually(getCluster(ctx, c), timeout, interval).Should(havePhase(etcdv1alpha1.EtcdClusterPhaseRunning))
	g.Eventually(eventReasons(ctx, c), timeout, interval).Should(ContainElements(etcdv1alpha1.ReasonResourceConflict, "Recovered"))
}

func TestDeletion(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ctx := context.Background()
	ns := env().Namespace(t)
	plainManager(t, ns)
	c := newCluster(ns, "deletion", 3)
	g.Expect(env().Client.Create(ctx, c)).To(Succeed())
	setReadyReplicas(ctx, g, ns, "deletion", 3)
	g.Eventually(getCluster(ctx, c), timeout, interval).Should(havePhase(etcdv1alpha1.EtcdClusterPhaseRunning))
	children := objectsOf(c)
	for _, obj := range children {
		g.Eventually(func() error { return env().Client.Get(ctx, client.ObjectKeyFromObject(obj), obj) }, timeout, interval).Should(Succeed())
	}

	// Hold the StatefulSet with a finalizer of the test's so the deletion
	// can be watched halfway.
	const hold = "test.example/hold"
	sts := &appsv1.StatefulSet{}
	g.Expect(env().Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "deletion"}, sts)).To(Succeed())
	sts.Finalizers = append(sts.Finalizers, hold)
	g.Expect(env().Client.Update(ctx, sts)).To(Succeed())

	g.Expect(env().Client.Delete(ctx, c)).To(Succeed())
	g.Eventually(getCluster(ctx, c), timeout, interval).Should(And(
		havePhase(etcdv1alpha1.EtcdClusterPhaseDeleting),
		haveCondition(etcdv1alpha1.ConditionReady, metav1.ConditionFalse, etcdv1alpha1.ReasonDeleting),
	))
	// The other children are deleted (no garbage collector runs here: the
	// operator itself removes them).
	for _, obj := range children {
		if _, isSts := obj.(*appsv1.StatefulSet); isSts {
			continue
		}
		expectGone(ctx, g, obj)
	}
	// The cluster waits for its StatefulSet.
	g.Consistently(getCluster(ctx, c), 500*time.Millisecond, 100*time.Millisecond).Should(
		WithTransform(func(c *etcdv1alpha1.EtcdCluster) []string { return c.Finalizers }, ContainElement(controller.Finalizer)))

	g.Eventually(func(g Gomega) {
		g.Expect(env().Client.Get(ctx, client.ObjectKeyFromObject(sts), sts)).To(Succeed())
		g.Expect(sts.DeletionTimestamp).NotTo(BeNil())
		sts.Finalizers = nil
		g.Expect(env().Client.Update(ctx, sts)).To(Succeed())
	}, timeout, interval).Should(Succeed())
	expectGone(ctx, g, sts)
	expectGone(ctx, g, &etcdv1alpha1.EtcdCluster{ObjectMeta: c.ObjectMeta})
}

func TestSpecChangesAndDrift(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ctx := context.Background()
	ns := env().Namespace(t)
	plainManager(t, ns)
	c := newCluster(ns, "changes", 3)
	c.Spec.Version = "3.5.21"
	g.Expect(env().Client.Create(ctx, c)).To(Succeed())
	setReadyReplicas(ctx, g, ns, "changes", 3)
	g.Eventually(getCluster(ctx, c), timeout, interval).Should(havePhase(etcdv1alpha1.EtcdClusterPhaseRunning))

	// Steady state: a reconcile (forced by an annotation) writes nothing.
	before := map[string]string{}
	for _, obj := range objectsOf(c) {
		g.Expect(env().Client.Get(ctx, client.ObjectKeyFromObject(obj), obj)).To(Succeed())
		before[obj.GetName()+kind(obj)] = obj.GetResourceVersion()
	}
	// The operator writes the cluster's status meanwhile: each edit reads
	// the cluster again until its update is not in conflict.
	editCluster(ctx, g, c, func(c *etcdv1alpha1.EtcdCluster) { c.Annotations = map[string]string{"touch": "1"} })
	// The status carries no resource version of its own; wait for the
	// reconcile through a drift we introduce after the touch.
	sts := &appsv1.StatefulSet{}
	g.Expect(env().Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "changes"}, sts)).To(Succeed())
	sts.Spec.Replicas = ptrInt32(7)
	g.Expect(env().Client.Update(ctx, sts)).To(Succeed())
	g.Eventually(func(g Gomega) int32 {
		g.Expect(env().Client.Get(ctx, client.ObjectKeyFromObject(sts), sts)).To(Succeed())
		return *sts.Spec.Replicas
	}, timeout, interval).Should(BeEquivalentTo(3), "drift of the StatefulSet is undone")
	for _, obj := range objectsOf(c) {
		if kind(obj) == "StatefulSet" {
			continue
		}
		g.Expect(env().Client.Get(ctx, client.ObjectKeyFromObject(obj), obj)).To(Succeed())
		g.Expect(obj.GetResourceVersion()).To(Equal(before[obj.GetName()+kind(obj)]), "%s %s was rewritten", kind(obj), obj.GetName())
	}

	// Grow and upgrade.
	editCluster(ctx, g, c, func(c *etcdv1alpha1.EtcdCluster) {
		c.Spec.Size = 5
		c.Spec.Version = "3.6.8"
		c.Spec.Network.ServiceType = corev1.ServiceTypeNodePort
	})
	// One member at a time: etcd gets member 3 as a learner, then the
	// StatefulSet grows by one; no pod starts here, so it stays there.
	g.Eventually(func(g Gomega) {
		g.Expect(env().Client.Get(ctx, client.ObjectKeyFromObject(sts), sts)).To(Succeed())
		g.Expect(*sts.Spec.Replicas).To(BeEquivalentTo(4))
		g.Expect(sts.Spec.Template.Spec.Containers[0].Image).To(HaveSuffix(":v3.6.8"))
		pdb := &policyv1.PodDisruptionBudget{}
		g.Expect(env().Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "changes"}, pdb)).To(Succeed())
		g.Expect(*pdb.Spec.MinAvailable).To(Equal(intstr.FromInt32(3)))
		g.Expect(sts.Spec.Template.Annotations).To(HaveKey("etcd.example.sharder.dev/config-hash"))
		svc := &corev1.Service{}
		g.Expect(env().Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "changes-client"}, svc)).To(Succeed())
		g.Expect(svc.Spec.Type).To(Equal(corev1.ServiceTypeNodePort))
		g.Expect(svc.Spec.Ports[0].NodePort).NotTo(BeZero())
	}, timeout, interval).Should(Succeed())

	// 3 of 5 healthy is a quorum: Scaling, not Ready (etcd lists 3 voting
	// members and the learner, which waits for its pod); the status
	// describes the new generation.
	g.Eventually(getCluster(ctx, c), timeout, interval).Should(And(
		havePhase(etcdv1alpha1.EtcdClusterPhaseScaling),
		haveCondition(etcdv1alpha1.ConditionReady, metav1.ConditionFalse, etcdv1alpha1.ReasonMembersMismatch),
		haveCondition(etcdv1alpha1.ConditionProgressing, metav1.ConditionTrue, etcdv1alpha1.ReasonStartingMember),
		WithTransform(func(got *etcdv1alpha1.EtcdCluster) bool { return got.Status.Members[3].IsLearner }, BeTrue()),
		WithTransform(func(got *etcdv1alpha1.EtcdCluster) bool { return got.Status.ObservedGeneration == got.Generation }, BeTrue()),
		WithTransform(func(got *etcdv1alpha1.EtcdCluster) int { return len(got.Status.Members) }, Equal(5)),
	))

	// The node port the API server allocated survives later reconciles.
	svc := &corev1.Service{}
	g.Expect(env().Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "changes-client"}, svc)).To(Succeed())
	rv := svc.ResourceVersion
	editCluster(ctx, g, c, func(c *etcdv1alpha1.EtcdCluster) { c.Annotations = map[string]string{"touch": "2"} })
	g.Consistently(func(g Gomega) string {
		g.Expect(env().Client.Get(ctx, client.ObjectKeyFromObject(svc), svc)).To(Succeed())
		return svc.ResourceVersion
	}, time.Second, 100*time.Millisecond).Should(Equal(rv))
}

func TestMembersFollowPods(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ctx := context.Background()
	ns := env().Namespace(t)
	plainManager(t, ns)
	c := newCluster(ns, "members", 3)
	g.Expect(env().Client.Create(ctx, c)).To(Succeed())
	g.Eventually(getCluster(ctx, c), timeout, interval).Should(havePhase(etcdv1alpha1.EtcdClusterPhaseCreating))

	// Play the StatefulSet controller and kubelet for member 1.
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "members-1", Labels: map[string]string{
			"app.kubernetes.io/name": "etcd", controller.LabelCluster: "members",
		}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "etcd", Image: etcdv1alpha1.DefaultRepository + ":v" + etcdv1alpha1.DefaultVersion}}},
	}
	g.Expect(env().Client.Create(ctx, pod)).To(Succeed())
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	g.Expect(env().Client.Status().Update(ctx, pod)).To(Succeed())

	readyMembers := func(got *etcdv1alpha1.EtcdCluster) []string {
		var out []string
		for _, m := range got.Status.Members {
			if m.Ready {
				out = append(out, m.Name)
			}
		}
		return out
	}
	g.Eventually(getCluster(ctx, c), timeout, interval).Should(WithTransform(readyMembers, Equal([]string{"members-1"})))

	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse}}
	g.Expect(env().Client.Status().Update(ctx, pod)).To(Succeed())
	g.Eventually(getCluster(ctx, c), timeout, interval).Should(WithTransform(readyMembers, BeEmpty()))
}

func kind(obj client.Object) string {
	switch obj.(type) {
	case *corev1.ConfigMap:
		return "ConfigMap"
	case *corev1.Service:
		return "Service"
	case *appsv1.StatefulSet:
		return "StatefulSet"
	case *policyv1.PodDisruptionBudget:
		return "PodDisruptionBudget"
	}
	return "?"
}

func ptrInt32(v int32) *int32 { return &v }

// editCluster applies edit to the cluster as the API server has it now and
// updates it, reading it again while the update conflicts with a write of
// the operator's.
func editCluster(ctx context.Context, g Gomega, c *etcdv1alpha1.EtcdCluster, edit func(*etcdv1alpha1.EtcdCluster)) {
	g.Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := env().Client.Get(ctx, client.ObjectKeyFromObject(c), c); err != nil {
			return err
		}
		edit(c)
		return env().Client.Update(ctx, c)
	})).To(Succeed())
}
