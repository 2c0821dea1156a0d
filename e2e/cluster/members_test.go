package cluster

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	etcdv1alpha1 "github.com/sharder-dev/sharder/examples/etcd-operator/api/v1alpha1"
	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// testMembership changes the members of the running cluster ec, whose etcd
// cli reaches through the client Service, and checks after each change
// that the keys are still there and etcd lists exactly the voting members
// the status reports:
//   - 3 → 5, the operator instance that owns ec force-deleted once the
//     scale-up started: another process (another instance, or the
//     StatefulSet's new pod of the same name) finishes it;
//   - 5 → 3;
//   - a member pod deleted: with its emptyDir its data is gone, and the
//     operator replaces the member (removed, added back as a learner);
//   - the version raised to the default: the members restart one at a
//     time and every one reports the new version.
func testMembership(t *testing.T, g Gomega, ec *etcdv1alpha1.EtcdCluster, cli *clientv3.Client, keys map[string]string) {
	ctx := t.Context()
	ring := operatorName
	key := client.ObjectKeyFromObject(ec)
	call := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 10*time.Second) }
	expectKeys := func() {
		for k, v := range keys {
			g.Eventually(func(g Gomega) {
				cctx, cancel := call()
				defer cancel()
				resp, err := cli.Get(cctx, k)
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(resp.Kvs).To(HaveLen(1))
				g.Expect(string(resp.Kvs[0].Value)).To(Equal(v))
			}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed(), k)
		}
	}
	// running checks Running and Ready with n healthy voting members,
	// which etcd itself lists, and returns the cluster.
	running := func(g Gomega, n int) etcdv1alpha1.EtcdCluster {
		var got etcdv1alpha1.EtcdCluster
		g.Expect(k8sClient.Get(ctx, key, &got)).To(Succeed())
		ready := meta.FindStatusCondition(got.Status.Conditions, etcdv1alpha1.ConditionReady)
		progress := meta.FindStatusCondition(got.Status.Conditions, etcdv1alpha1.ConditionProgressing)
		g.Expect(ready).NotTo(BeNil())
		g.Expect(got.Status.Phase).To(Equal(etcdv1alpha1.EtcdClusterPhaseRunning), "Ready: %s; Progressing: %v", ready.Message, progress)
		g.Expect(ready.Status).To(Equal(metav1.ConditionTrue), ready.Message)
		g.Expect(got.Status.HealthyMembers).To(BeEquivalentTo(n))
		cctx, cancel := call()
		defer cancel()
		list, err := cli.MemberList(cctx)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(list.Members).To(HaveLen(n))
		for _, m := range list.Members {
			g.Expect(m.IsLearner).To(BeFalse(), m.Name)
		}
		return got
	}
	runningWith := func(n int, within time.Duration) etcdv1alpha1.EtcdCluster {
		var got etcdv1alpha1.EtcdCluster
		g.Eventually(func(g Gomega) { got = running(g, n) }).WithTimeout(within).WithPolling(time.Second).Should(Succeed())
		return got
	}
	setSpec := func(change func(*etcdv1alpha1.EtcdCluster)) {
		g.Eventually(func(g Gomega) {
			var c etcdv1alpha1.EtcdCluster
			g.Expect(k8sClient.Get(ctx, key, &c)).To(Succeed())
			change(&c)
			g.Expect(k8sClient.Update(ctx, &c)).To(Succeed())
		}).WithTimeout(30 * time.Second).WithPolling(time.Second).Should(Succeed())
	}
	put := func(k, v string) {
		g.Eventually(func() error {
			cctx, cancel := call()
			defer cancel()
			_, err := cli.Put(cctx, k, v)
			return err
		}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
		keys[k] = v
	}

	By(t, "3 → 5, the owning operator instance force-deleted once a learner is added")
	start := time.Now()
	var before etcdv1alpha1.EtcdCluster
	g.Expect(k8sClient.Get(ctx, key, &before)).To(Succeed())
	owner := before.Labels[sharderv1alpha1.ShardLabel(ring)]
	g.Expect(owner).NotTo(BeEmpty())
	var victim corev1.Pod
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: operatorNamespace, Name: owner}, &victim)).To(Succeed())
	setSpec(func(c *etcdv1alpha1.EtcdCluster) { c.Spec.Size = 5 })
	g.Eventually(func(g Gomega) {
		var c etcdv1alpha1.EtcdCluster
		g.Expect(k8sClient.Get(ctx, key, &c)).To(Succeed())
		g.Expect(c.Status.Phase).To(Equal(etcdv1alpha1.EtcdClusterPhaseScaling))
		g.Expect(slices.ContainsFunc(c.Status.Members, func(m etcdv1alpha1.EtcdMember) bool { return m.IsLearner })).To(BeTrue(),
			"a learner is listed")
	}).WithTimeout(2 * time.Minute).WithPolling(200 * time.Millisecond).Should(Succeed())
	if _, err := kubectl(ctx, "delete", "pod", "--namespace", operatorNamespace, owner, "--force", "--grace-period=0"); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	// The owners the cluster has from now on, as its shard label says.
	owners := []string{}
	watchDone := make(chan struct{})
	watchCtx, stopWatch := context.WithCancel(ctx)
	go func() {
		defer close(watchDone)
		for watchCtx.Err() == nil {
			var c etcdv1alpha1.EtcdCluster
			if err := k8sClient.Get(watchCtx, key, &c); err == nil {
				if o := c.Labels[sharderv1alpha1.ShardLabel(ring)]; len(owners) == 0 || owners[len(owners)-1] != o {
					owners = append(owners, o)
				}
			}
			select {
			case <-watchCtx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	got := runningWith(5, 4*time.Minute)
	stopWatch()
	<-watchDone
	t.Logf("5 voting members %s after the scale-up began, %s after %s was force-deleted; owners since: %v",
		time.Since(start).Round(time.Second), time.Since(killed).Round(time.Second), owner, owners)
	var now corev1.Pod
	finisher := got.Labels[sharderv1alpha1.ShardLabel(ring)]
	if finisher == owner {
		// Back on an instance of the same name: it must be the new pod.
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: operatorNamespace, Name: owner}, &now)).To(Succeed())
		g.Expect(now.UID).NotTo(Equal(victim.UID), "the scale-up finished on the force-deleted pod")
	}
	expectKeys()
	put("/e2e/at-5", fmt.Sprintf("written with 5 members at %s", time.Now().UTC().Format(time.RFC3339Nano)))

	By(t, "5 → 3")
	start = time.Now()
	setSpec(func(c *etcdv1alpha1.EtcdCluster) { c.Spec.Size = 3 })
	runningWith(3, 3*time.Minute)
	g.Eventually(func(g Gomega) {
		var pods corev1.PodList
		g.Expect(k8sClient.List(ctx, &pods, client.InNamespace(ec.Namespace), client.MatchingLabels{"etcd.example.sharder.dev/cluster": ec.Name})).To(Succeed())
		g.Expect(pods.Items).To(HaveLen(3))
	}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
	t.Logf("3 voting members %s after the scale-down began", time.Since(start).Round(time.Second))
	expectKeys()

	By(t, "a member pod deleted: its member is replaced")
	start = time.Now()
	got = runningWith(3, time.Minute)
	oldID := got.Status.Members[1].ID
	g.Expect(k8sClient.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ec.Namespace, Name: ec.Name + "-1"}})).To(Succeed())
	g.Eventually(func(g Gomega) {
		var c etcdv1alpha1.EtcdCluster
		g.Expect(k8sClient.Get(ctx, key, &c)).To(Succeed())
		g.Expect(c.Status.Members[1].ID).NotTo(Equal(oldID))
	}).WithTimeout(3 * time.Minute).WithPolling(time.Second).Should(Succeed())
	got = runningWith(3, 3*time.Minute)
	g.Expect(got.Status.Members[1].ID).NotTo(BeEmpty())
	g.Expect(got.Status.Members[1].ID).NotTo(Equal(oldID), "%s-1 came back as a new member", ec.Name)
	t.Logf("member %s-1 replaced in %s", ec.Name, time.Since(start).Round(time.Second))
	expectKeys()

	By(t, "upgraded to the default version, one member at a time")
	start = time.Now()
	setSpec(func(c *etcdv1alpha1.EtcdCluster) { c.Spec.Version = etcdv1alpha1.DefaultVersion })
	g.Eventually(func(g Gomega) {
		got = running(g, 3)
		for _, m := range got.Status.Members {
			g.Expect(m.Version).To(Equal(etcdv1alpha1.DefaultVersion), m.Name)
		}
	}).WithTimeout(5 * time.Minute).WithPolling(2 * time.Second).Should(Succeed())
	t.Logf("upgraded from %s to %s in %s", previousEtcdVersion, etcdv1alpha1.DefaultVersion, time.Since(start).Round(time.Second))
	expectKeys()
}
