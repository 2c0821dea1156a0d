package cluster

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	etcdv1alpha1 "github.com/sharder-dev/sharder/examples/etcd-operator/api/v1alpha1"
)

// previousEtcdVersion is the etcd release of the image make images builds
// from hack/tools/etcd35 (ETCD_PREVIOUS_VERSION); the cluster starts on it
// and is upgraded to the default version.
const previousEtcdVersion = "3.5.35"

// realEtcdNamespace holds the EtcdCluster that runs real etcd, apart from
// the scenario's clusters of size 1 (which the tracker counts).
const realEtcdNamespace = "etcd-real"

// testRealEtcd: with the operator's 4 instances running, an EtcdCluster of
// size 3 makes its StatefulSet run 3 etcd members (the previous minor
// release's image built here) that find each other through the cluster DNS
// and form one cluster. The operator reports Running only with etcd's own
// word: every member listed, healthy, a leader and the cluster ID, which the
// test checks against etcd itself; a key written through the client Service
// is read back. Then the members change with the keys kept (testMembership):
// 3 → 5 while the operator instance that owns the cluster is force-deleted,
// 5 → 3, a member pod deleted and replaced, and an upgrade to the current
// release.
func testRealEtcd(t *testing.T) {
	g := NewWithT(t)
	ctx := t.Context()
	t.Cleanup(func() {
		if t.Failed() {
			out, err := kubectl(context.Background(), "get", "etcdclusters", "--namespace", realEtcdNamespace, "-o", "yaml")
			t.Logf("EtcdClusters (%v):\n%s", err, out)
			dumpState(t, realEtcdNamespace, "app.kubernetes.io/name=etcd")
			dumpState(t, operatorNamespace, "app.kubernetes.io/name="+operatorName)
		}
	})

	By(t, "an EtcdCluster of 3 members on emptyDir volumes")
	g.Expect(k8sClient.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: realEtcdNamespace}})).To(Succeed())
	waitDefaultServiceAccount(ctx, g, realEtcdNamespace)
	ec := &etcdv1alpha1.EtcdCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: realEtcdNamespace, Name: "kv"},
		Spec: etcdv1alpha1.EtcdClusterSpec{
			Size:    3,
			Version: previousEtcdVersion,
			Storage: etcdv1alpha1.EtcdStorageSpec{Ephemeral: true},
			Resources: etcdv1alpha1.EtcdResourceSpec{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
			},
		},
	}
	g.Expect(k8sClient.Create(ctx, ec)).To(Succeed())
	start := time.Now()

	By(t, "Running, with the members, leader and cluster ID etcd reports")
	var got etcdv1alpha1.EtcdCluster
	g.Eventually(func(g Gomega) {
		g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(ec), &got)).To(Succeed())
		ready := meta.FindStatusCondition(got.Status.Conditions, etcdv1alpha1.ConditionReady)
		g.Expect(ready).NotTo(BeNil())
		g.Expect(got.Status.Phase).To(Equal(etcdv1alpha1.EtcdClusterPhaseRunning), "Ready: %s", ready.Message)
		g.Expect(ready.Status).To(Equal(metav1.ConditionTrue), ready.Message)
	}).WithTimeout(3 * time.Minute).WithPolling(time.Second).Should(Succeed())
	t.Logf("Running after %s: leader %s, cluster %s", time.Since(start).Round(time.Second), got.Status.Leader, got.Status.ClusterID)
	g.Expect(got.Status.HealthyMembers).To(Equal(int32(3)))
	g.Expect(got.Status.Members).To(HaveLen(3))
	ids := map[string]string{}
	for _, m := range got.Status.Members {
		g.Expect(m.Healthy).To(BeTrue(), m.Name)
		g.Expect(m.Ready).To(BeTrue(), m.Name)
		g.Expect(m.IsLearner).To(BeFalse(), m.Name)
		g.Expect(m.ID).NotTo(BeEmpty(), m.Name)
		ids[m.Name] = m.ID
	}

	By(t, "etcd, asked through the client Service, agrees and serves a key")
	var svc corev1.Service
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: realEtcdNamespace, Name: "kv-client"}, &svc)).To(Succeed())
	endpoint := "http://" + net.JoinHostPort(svc.Spec.ClusterIP, strconv.Itoa(int(svc.Spec.Ports[0].Port)))
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = cli.Close() }()
	call := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 10*time.Second) }

	cctx, cancel := call()
	list, err := cli.MemberList(cctx)
	cancel()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(strconv.FormatUint(list.Header.ClusterId, 16)).To(Equal(got.Status.ClusterID))
	g.Expect(list.Members).To(HaveLen(3))
	for _, m := range list.Members {
		g.Expect(ids).To(HaveKeyWithValue(m.Name, strconv.FormatUint(m.ID, 16)))
	}
	cctx, cancel = call()
	st, err := cli.Status(cctx, endpoint)
	cancel()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(strconv.FormatUint(st.Leader, 16)).To(Equal(got.Status.LeaderID))
	g.Expect(ids).To(HaveKeyWithValue(got.Status.Leader, got.Status.LeaderID))

	value := fmt.Sprintf("written at %s", time.Now().UTC().Format(time.RFC3339Nano))
	cctx, cancel = call()
	_, err = cli.Put(cctx, "/e2e/key", value)
	cancel()
	g.Expect(err).NotTo(HaveOccurred())
	cctx, cancel = call()
	resp, err := cli.Get(cctx, "/e2e/key")
	cancel()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(resp.Kvs).To(HaveLen(1))
	g.Expect(string(resp.Kvs[0].Value)).To(Equal(value))

	testMembership(t, g, ec, cli, map[string]string{"/e2e/key": value})

	By(t, "deleted, the cluster goes with its members")
	g.Expect(k8sClient.Delete(ctx, ec)).To(Succeed())
	g.Eventually(func(g Gomega) {
		var pods corev1.PodList
		g.Expect(k8sClient.List(ctx, &pods, client.InNamespace(realEtcdNamespace))).To(Succeed())
		g.Expect(pods.Items).To(BeEmpty())
		err := k8sClient.Get(ctx, client.ObjectKeyFromObject(ec), &etcdv1alpha1.EtcdCluster{})
		g.Expect(client.IgnoreNotFound(err)).To(Succeed())
		g.Expect(err).To(HaveOccurred())
	}).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
	// The force-deleted instance's replacement runs: the next scenarios
	// start from 4 ready instances.
	waitStatefulSetReady(ctx, g, operatorNamespace, operatorName, 4)
}
