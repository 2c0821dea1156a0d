package controller

import (
	"context"
	"errors"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	etcdv1alpha1 "github.com/sharder-dev/sharder/examples/etcd-operator/api/v1alpha1"
	"github.com/sharder-dev/sharder/examples/etcd-operator/internal/etcdtest"
)

// TestObserveRealEtcd asks a real 3-member etcd what the status reports:
// members, IDs, leader, cluster ID and health; then with one member stopped
// (a quorum serves, the cluster is not complete), with two stopped (etcd does
// not answer, within the timeout), and with both back.
func TestObserveRealEtcd(t *testing.T) {
	g := NewWithT(t)
	ctx := t.Context()
	local := etcdtest.Start(t, "main-0", "main-1", "main-2")
	c := &etcdv1alpha1.EtcdCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "db", Name: "main"}, Spec: etcdv1alpha1.EtcdClusterSpec{Size: 3}}
	s := spec(c)
	observe := func() etcdView { return observeEtcd(ctx, local.ClientURLs(), 3*time.Second) }
	phaseFrom := func(prev etcdv1alpha1.EtcdClusterPhase, v etcdView) etcdv1alpha1.EtcdClusterPhase {
		healthy := v.healthyVoters()
		serving := v.answered() && v.leaderID != 0 && healthy >= quorum(3)
		p, _ := nextPhase(observation{phase: prev, size: 3, ready: 3, serving: serving,
			complete: serving && v.voters() == 3 && healthy == 3})
		return p
	}

	By(t, "every member answers")
	var v etcdView
	g.Eventually(func(g Gomega) {
		v = observe()
		g.Expect(v.err).NotTo(HaveOccurred())
		g.Expect(v.healthyVoters()).To(Equal(int32(3)))
		g.Expect(v.leaderID).NotTo(BeZero())
	}).WithTimeout(20 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
	g.Expect(v.clusterID).NotTo(BeZero())
	g.Expect(v.voters()).To(Equal(int32(3)))
	leader, ok := v.member(v.leaderID)
	g.Expect(ok).To(BeTrue(), "the leader %x is a listed member", v.leaderID)
	members := desiredMembers(c, s, nil, v)
	g.Expect(members).To(HaveLen(3))
	for i, m := range members {
		g.Expect(m.Name).To(Equal(memberName(c, int32(i))))
		g.Expect(m.ID).NotTo(BeEmpty())
		g.Expect(m.Healthy).To(BeTrue(), m.Name)
		g.Expect(m.IsLearner).To(BeFalse(), m.Name)
	}
	g.Expect(phaseFrom(etcdv1alpha1.EtcdClusterPhaseCreating, v)).To(Equal(etcdv1alpha1.EtcdClusterPhaseRunning))
	t.Logf("cluster %s, leader %s (%s)", formatID(v.clusterID), leader.name, formatID(v.leaderID))

	By(t, "a follower stopped: a quorum serves, the cluster is not complete")
	stopped := 0
	if leader.name == "main-0" {
		stopped = 1
	}
	local.Stop(stopped)
	g.Eventually(func(g Gomega) {
		v = observe()
		g.Expect(v.err).NotTo(HaveOccurred())
		g.Expect(v.healthyVoters()).To(Equal(int32(2)))
	}).WithTimeout(20 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
	g.Expect(v.voters()).To(Equal(int32(3)), "a stopped member is still a member")
	g.Expect(v.clusterID).NotTo(BeZero())
	for _, m := range desiredMembers(c, s, nil, v) {
		g.Expect(m.Healthy).To(Equal(m.Name != memberName(c, int32(stopped))), m.Name)
	}
	g.Expect(phaseFrom(etcdv1alpha1.EtcdClusterPhaseCreating, v)).To(Equal(etcdv1alpha1.EtcdClusterPhaseCreating), "never complete: stays Creating")
	g.Expect(phaseFrom(etcdv1alpha1.EtcdClusterPhaseRunning, v)).To(Equal(etcdv1alpha1.EtcdClusterPhaseRunning), "a quorum serves: stays Running")

	By(t, "two members stopped: etcd does not answer, within the timeout")
	for i := range local.Members() {
		if i != stopped && local.Members()[i].Name != leader.name {
			local.Stop(i)
		}
	}
	start := time.Now()
	v = observeEtcd(ctx, local.ClientURLs(), 2*time.Second)
	g.Expect(v.err).To(HaveOccurred())
	g.Expect(time.Since(start)).To(BeNumerically("<", 10*time.Second))
	g.Expect(phaseFrom(etcdv1alpha1.EtcdClusterPhaseRunning, v)).To(Equal(etcdv1alpha1.EtcdClusterPhaseFailed))
	for _, m := range desiredMembers(c, s, nil, v) {
		g.Expect(m.Healthy).To(BeFalse(), m.Name)
	}

	By(t, "both back: every member answers again")
	for i, m := range local.Members() {
		if m.Name != leader.name {
			local.Restart(i)
		}
	}
	g.Eventually(func(g Gomega) {
		v = observe()
		g.Expect(v.err).NotTo(HaveOccurred())
		g.Expect(v.healthyVoters()).To(Equal(int32(3)))
		g.Expect(v.leaderID).NotTo(BeZero())
	}).WithTimeout(30 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
	g.Expect(phaseFrom(etcdv1alpha1.EtcdClusterPhaseFailed, v)).To(Equal(etcdv1alpha1.EtcdClusterPhaseRunning))
}

// TestObserveBounded: no address, a cancelled context and an address where
// nothing listens each end with an error, promptly.
func TestObserveBounded(t *testing.T) {
	g := NewWithT(t)
	v := observeEtcd(t.Context(), nil, time.Second)
	g.Expect(errors.Is(v.err, errNoEndpoints)).To(BeTrue())

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	start := time.Now()
	v = observeEtcd(ctx, []string{"http://127.0.0.1:1"}, 30*time.Second)
	g.Expect(v.err).To(HaveOccurred())
	g.Expect(time.Since(start)).To(BeNumerically("<", 5*time.Second))

	start = time.Now()
	v = observeEtcd(t.Context(), []string{"http://127.0.0.1:1"}, time.Second)
	g.Expect(v.err).To(HaveOccurred())
	g.Expect(time.Since(start)).To(BeNumerically("<", 5*time.Second))
}

// TestMemberEndpoints: pods with an address, not being deleted, with the
// client port.
func TestMemberEndpoints(t *testing.T) {
	g := NewWithT(t)
	c := &etcdv1alpha1.EtcdCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "db", Name: "main"}}
	c.Spec.Network.ClientPort = 12379
	now := metav1.Now()
	pods := []corev1.Pod{
		{ObjectMeta: metav1.ObjectMeta{Name: "main-1"}, Status: corev1.PodStatus{PodIP: "10.0.0.2"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "main-0"}, Status: corev1.PodStatus{PodIP: "10.0.0.1"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "main-2"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "main-3", DeletionTimestamp: &now}, Status: corev1.PodStatus{PodIP: "10.0.0.4"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "main-4"}, Status: corev1.PodStatus{PodIP: "fd00::5"}},
	}
	g.Expect(memberEndpoints(c, pods)).To(Equal([]string{"http://10.0.0.1:12379", "http://10.0.0.2:12379", "http://[fd00::5]:12379"}))
}

// By logs a step of a test.
func By(t *testing.T, step string) {
	t.Helper()
	t.Logf("STEP: %s", step)
}
