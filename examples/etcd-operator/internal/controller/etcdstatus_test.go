package controller_test

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	etcdv1alpha1 "github.com/sharder-dev/sharder/examples/etcd-operator/api/v1alpha1"
	"github.com/sharder-dev/sharder/examples/etcd-operator/internal/controller"
	"github.com/sharder-dev/sharder/examples/etcd-operator/internal/etcdtest"
)

// TestRunningFollowsEtcd: with every pod ready all along, the phase follows
// what a real etcd answers. Running with its members, leader and cluster ID;
// a member stopped is unhealthy (Running, not Ready); two stopped and etcd
// does not answer (Failed, QuorumLost, Available False EtcdUnreachable) even
// though the pods are ready; both back and it is Running again.
func TestRunningFollowsEtcd(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	local := etcdtest.Start(t, "answer-0", "answer-1", "answer-2")
	ctx := context.Background()
	ns := env().Namespace(t)
	startManager(t, controller.Options{
		Endpoints: func(*etcdv1alpha1.EtcdCluster, []corev1.Pod) []string { return local.ClientURLs() },
	}, inNamespace(ns))
	c := newCluster(ns, "answer", 3)
	g.Expect(env().Client.Create(ctx, c)).To(Succeed())
	setReadyReplicas(ctx, g, ns, "answer", 3)

	healthy := func(got *etcdv1alpha1.EtcdCluster) map[string]bool {
		out := map[string]bool{}
		for _, m := range got.Status.Members {
			out[m.Name] = m.Healthy
		}
		return out
	}
	var got *etcdv1alpha1.EtcdCluster
	g.Eventually(func(g Gomega) {
		got = getCluster(ctx, c)(g)
		g.Expect(got).To(And(
			havePhase(etcdv1alpha1.EtcdClusterPhaseRunning),
			haveCondition(etcdv1alpha1.ConditionReady, metav1.ConditionTrue, etcdv1alpha1.ReasonMembersReady),
		))
	}, timeout, interval).Should(Succeed())
	g.Expect(got.Status.HealthyMembers).To(BeEquivalentTo(3))
	g.Expect(got.Status.ClusterID).NotTo(BeEmpty())
	g.Expect(got.Status.LeaderID).NotTo(BeEmpty())
	g.Expect(got.Status.Leader).To(HavePrefix("answer-"))
	g.Expect(healthy(got)).To(Equal(map[string]bool{"answer-0": true, "answer-1": true, "answer-2": true}))
	clusterID := got.Status.ClusterID

	// A follower stopped: a quorum serves.
	leader := got.Status.Leader
	followers := []int{}
	for i, m := range local.Members() {
		if m.Name != leader {
			followers = append(followers, i)
		}
	}
	local.Stop(followers[0])
	stopped := local.Members()[followers[0]].Name
	g.Eventually(func(g Gomega) {
		got = getCluster(ctx, c)(g)
		g.Expect(got).To(And(
			havePhase(etcdv1alpha1.EtcdClusterPhaseRunning),
			haveCondition(etcdv1alpha1.ConditionReady, metav1.ConditionFalse, etcdv1alpha1.ReasonMembersNotReady),
			haveCondition(etcdv1alpha1.ConditionAvailable, metav1.ConditionTrue, etcdv1alpha1.ReasonQuorumReady),
		))
		g.Expect(got.Status.HealthyMembers).To(BeEquivalentTo(2))
		g.Expect(healthy(got)).To(HaveKeyWithValue(stopped, false))
	}, timeout, interval).Should(Succeed())

	// Both followers stopped: the pods still say ready, etcd does not answer.
	local.Stop(followers[1])
	g.Eventually(func(g Gomega) {
		got = getCluster(ctx, c)(g)
		g.Expect(got).To(And(
			havePhase(etcdv1alpha1.EtcdClusterPhaseFailed),
			haveCondition(etcdv1alpha1.ConditionReady, metav1.ConditionFalse, etcdv1alpha1.ReasonQuorumLost),
			haveCondition(etcdv1alpha1.ConditionAvailable, metav1.ConditionFalse, etcdv1alpha1.ReasonEtcdUnreachable),
		))
		g.Expect(got.Status.ReadyReplicas).To(BeEquivalentTo(3))
	}, timeout, interval).Should(Succeed())
	g.Expect(got.Status.ClusterID).To(Equal(clusterID), "the cluster ID is kept while etcd does not answer")

	// Both back: Running again, on its own.
	local.Restart(followers[0])
	local.Restart(followers[1])
	g.Eventually(func(g Gomega) {
		got = getCluster(ctx, c)(g)
		g.Expect(got).To(And(
			havePhase(etcdv1alpha1.EtcdClusterPhaseRunning),
			haveCondition(etcdv1alpha1.ConditionReady, metav1.ConditionTrue, etcdv1alpha1.ReasonMembersReady),
		))
		g.Expect(got.Status.HealthyMembers).To(BeEquivalentTo(3))
	}, timeout, interval).Should(Succeed())
	g.Eventually(eventReasons(ctx, c), timeout, interval).Should(ContainElements(etcdv1alpha1.ReasonQuorumLost, "Recovered"))
}
