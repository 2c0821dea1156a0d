package controller

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	etcdv1alpha1 "github.com/sharder-dev/sharder/examples/etcd-operator/api/v1alpha1"
	"github.com/sharder-dev/sharder/examples/etcd-operator/internal/etcdtest"
	"github.com/sharder-dev/sharder/internal/testenv"
)

// TestObserveRealEtcd asks a real 3-member etcd what the status reports:
// members, IDs, leader, cluster ID and health; then with one member stopped
// (a quorum serves, the cluster is not complete), with two stopped (etcd does
// not answer, within the timeout), and with both back.
func TestObserveRealEtcd(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ctx := t.Context()
	local := etcdtest.Start(t, "main-0", "main-1", "main-2")
	c := &etcdv1alpha1.EtcdCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "db", Name: "main"}, Spec: etcdv1alpha1.EtcdClusterSpec{Size: 3}}
	s := spec(c)
	observe := func() etcdView { return observeEtcd(ctx, etcdAccess{}, local.ClientURLs(), 3*time.Second) }
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
	members := desiredMembers(c, s, nil, v, func(i int32) string { return peerURL(c, s, i) })
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
	for _, m := range desiredMembers(c, s, nil, v, func(i int32) string { return peerURL(c, s, i) }) {
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
	v = observeEtcd(ctx, etcdAccess{}, local.ClientURLs(), 2*time.Second)
	g.Expect(v.err).To(HaveOccurred())
	g.Expect(time.Since(start)).To(BeNumerically("<", 10*time.Second))
	g.Expect(phaseFrom(etcdv1alpha1.EtcdClusterPhaseRunning, v)).To(Equal(etcdv1alpha1.EtcdClusterPhaseFailed))
	for _, m := range desiredMembers(c, s, nil, v, func(i int32) string { return peerURL(c, s, i) }) {
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
	v := observeEtcd(t.Context(), etcdAccess{}, nil, time.Second)
	g.Expect(errors.Is(v.err, errNoEndpoints)).To(BeTrue())

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	start := time.Now()
	v = observeEtcd(ctx, etcdAccess{}, []string{"http://127.0.0.1:1"}, 30*time.Second)
	g.Expect(v.err).To(HaveOccurred())
	g.Expect(time.Since(start)).To(BeNumerically("<", 5*time.Second))

	start = time.Now()
	v = observeEtcd(t.Context(), etcdAccess{}, []string{"http://127.0.0.1:1"}, time.Second)
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

// TestMemberSettingsRunEtcd runs the etcd binary with exactly the settings a
// member pod gets (the ConfigMap's variables and the container's own, with
// $(ETCD_NAME) expanded as the kubelet does) for a cluster of one member,
// and asks it for its status: the settings are ones etcd accepts, and the
// member advertises its DNS names.
func TestMemberSettingsRunEtcd(t *testing.T) {
	g := NewWithT(t)
	assets, err := testenv.AssetsDir()
	g.Expect(err).NotTo(HaveOccurred())
	clientPort, peerPort := freePort(t), freePort(t)
	c := &etcdv1alpha1.EtcdCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "db", Name: "solo", UID: "u1"}}
	c.Spec.Size = 1
	c.Spec.Network.ClientPort, c.Spec.Network.PeerPort = clientPort, peerPort
	c.Spec.Advanced.DataDir = t.TempDir()
	s := spec(c)
	cm := buildConfigMap(c, s)
	sts := buildStatefulSet(c, s, hashData(cm.Data), 1)
	container := sts.Spec.Template.Spec.Containers[0]
	env := []string{}
	for k, v := range cm.Data {
		env = append(env, k+"="+v)
	}
	name := memberName(c, 0)
	// What the Downward API gives the container: the pod's name, and the
	// annotations the operator writes before it lets a new cluster's pod start.
	fields := map[string]string{
		"metadata.name": name,
		"metadata.annotations['" + annotationInitialCluster + "']":      name + "=" + peerURL(c, s, 0),
		"metadata.annotations['" + annotationInitialClusterState + "']": "new",
	}
	for _, e := range container.Env {
		v := e.Value
		if e.ValueFrom != nil {
			var ok bool
			v, ok = fields[e.ValueFrom.FieldRef.FieldPath]
			g.Expect(ok).To(BeTrue(), "unknown field %s", e.ValueFrom.FieldRef.FieldPath)
		}
		env = append(env, e.Name+"="+strings.ReplaceAll(v, "$(ETCD_NAME)", name))
	}
	cmd := exec.CommandContext(t.Context(), filepath.Join(assets, "etcd"))
	cmd.Env = env
	out := &strings.Builder{}
	cmd.Stdout, cmd.Stderr = out, out
	g.Expect(cmd.Start()).To(Succeed())
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("etcd output:\n%s", out.String())
		}
	})
	endpoint := fmt.Sprintf("http://127.0.0.1:%d", clientPort)
	var v etcdView
	g.Eventually(func(g Gomega) {
		v = observeEtcd(t.Context(), etcdAccess{}, []string{endpoint}, 2*time.Second)
		g.Expect(v.err).NotTo(HaveOccurred())
		g.Expect(v.healthyVoters()).To(Equal(int32(1)))
	}).WithTimeout(30 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
	g.Expect(v.members).To(HaveLen(1))
	m := v.members[0]
	g.Expect(m.name).To(Equal(name))
	g.Expect(m.peerURLs).To(Equal([]string{peerURL(c, s, 0)}))
	g.Expect(m.clientURLs).To(Equal([]string{clientURL(c, s, 0)}))
	g.Expect(filepath.Join(c.Spec.Advanced.DataDir, "data", "member")).To(BeADirectory())
}

func freePort(t *testing.T) int32 {
	var lc net.ListenConfig
	l, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return int32(l.Addr().(*net.TCPAddr).Port)
}
