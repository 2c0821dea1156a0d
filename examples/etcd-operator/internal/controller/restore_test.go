package controller_test

import (
	"context"
	"encoding/json"
	"testing"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	etcdv1alpha1 "github.com/sharder-dev/sharder/examples/etcd-operator/api/v1alpha1"
	"github.com/sharder-dev/sharder/examples/etcd-operator/internal/controller"
	"github.com/sharder-dev/sharder/examples/etcd-operator/internal/etcdtest"
)

func getRestore(ctx context.Context, r *etcdv1alpha1.EtcdRestore) func(Gomega) *etcdv1alpha1.EtcdRestore {
	return func(g Gomega) *etcdv1alpha1.EtcdRestore {
		out := &etcdv1alpha1.EtcdRestore{}
		g.Expect(env().Client.Get(ctx, client.ObjectKeyFromObject(r), out)).To(Succeed())
		return out
	}
}

func newRestore(ns, name, backup, cluster string) *etcdv1alpha1.EtcdRestore {
	return &etcdv1alpha1.EtcdRestore{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: etcdv1alpha1.EtcdRestoreSpec{
			BackupName: backup, ClusterName: cluster, RestoreType: etcdv1alpha1.RestoreTypeNew,
			ClusterTemplate: &etcdv1alpha1.EtcdClusterSpec{Size: 3},
		},
	}
}

// TestRestoreCreatesCluster: a restore of a completed backup creates a new
// cluster from its template whose members restore the snapshot in an init
// container (the operator's image, the etcd container's settings, the
// store's keys from the Secret) before etcd starts; the restore is Running
// until the cluster is, then Completed. It refuses a name taken by a
// cluster it did not create, a backup that does not exist, and a Replace.
func TestRestoreCreatesCluster(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ctx := context.Background()
	local := etcdtest.Start(t, "orig-0")
	restoredEtcd := etcdtest.Start(t, "copy-0", "copy-1", "copy-2")
	be := startBackups(t, func(c *etcdv1alpha1.EtcdCluster, _ []corev1.Pod) []string {
		if c.Name == "copy" {
			return restoredEtcd.ClientURLs()
		}
		return local.ClientURLs()
	}, true)
	g.Expect(env().Client.Create(ctx, newCluster(be.ns, "orig", 1))).To(Succeed())
	b := be.backup("orig-backup", "orig")
	g.Expect(env().Client.Create(ctx, b)).To(Succeed())
	var backup *etcdv1alpha1.EtcdBackup
	g.Eventually(func(g Gomega) {
		backup = getBackup(ctx, b)(g)
		g.Expect(backup.Status.Phase).To(Equal(etcdv1alpha1.EtcdBackupPhaseCompleted))
	}, timeout, interval).Should(Succeed())

	rs := newRestore(be.ns, "bring-back", b.Name, "copy")
	g.Expect(env().Client.Create(ctx, rs)).To(Succeed())
	c := &etcdv1alpha1.EtcdCluster{ObjectMeta: metav1.ObjectMeta{Namespace: be.ns, Name: "copy"}}
	got := getCluster(ctx, c)
	g.Eventually(got, timeout, interval).Should(WithTransform(func(c *etcdv1alpha1.EtcdCluster) int32 { return c.Spec.Size }, BeEquivalentTo(3)))
	var src map[string]any
	g.Expect(json.Unmarshal([]byte(got(g).Annotations[controller.AnnotationRestoreSource]), &src)).To(Succeed())
	key := backup.Status.StoragePath[len("s3://backups/"):]
	g.Expect(src).To(HaveKeyWithValue("key", key))

	g.Eventually(func(g Gomega) {
		r := getRestore(ctx, rs)(g)
		g.Expect(r.Status.Phase).To(Equal(etcdv1alpha1.EtcdRestorePhaseRunning))
		g.Expect(succeeded(r.Status.Conditions)).To(Equal("Unknown/ClusterStarting"))
		g.Expect(r.Status.RestoredCluster).To(Equal("copy"))
		g.Expect(r.Status.RestoredSize).To(Equal(backup.Status.BackupSize))
	}, timeout, interval).Should(Succeed())

	// The members restore before etcd starts.
	sts := &appsv1.StatefulSet{}
	g.Eventually(func() error {
		return env().Client.Get(ctx, client.ObjectKey{Namespace: be.ns, Name: "copy"}, sts)
	}, timeout, interval).Should(Succeed())
	pod := sts.Spec.Template.Spec
	g.Expect(pod.InitContainers).To(HaveLen(1))
	init, etcd := pod.InitContainers[0], pod.Containers[0]
	g.Expect(init.Image).To(Equal("example.test/etcd-operator:test"))
	g.Expect(init.Args).To(Equal([]string{controller.RestoreMemberCommand}))
	g.Expect(init.VolumeMounts).To(Equal(etcd.VolumeMounts))
	g.Expect(init.EnvFrom).To(Equal(etcd.EnvFrom))
	initEnv := map[string]corev1.EnvVar{}
	for _, e := range init.Env {
		initEnv[e.Name] = e
	}
	for _, e := range etcd.Env {
		g.Expect(initEnv).To(HaveKeyWithValue(e.Name, e))
	}
	g.Expect(initEnv[controller.EnvRestoreKey].Value).To(Equal(key))
	g.Expect(initEnv[controller.EnvRestoreBucket].Value).To(Equal("backups"))
	g.Expect(initEnv[controller.EnvRestoreEndpoint].Value).To(Equal(be.store.Endpoint))
	g.Expect(initEnv[controller.SecretKeyAccessKeyID].ValueFrom.SecretKeyRef.Name).To(Equal("s3"))

	// The members run: the restore is done.
	setReadyReplicas(ctx, g, be.ns, "copy", 3)
	g.Eventually(func(g Gomega) {
		r := getRestore(ctx, rs)(g)
		g.Expect(r.Status.Phase).To(Equal(etcdv1alpha1.EtcdRestorePhaseCompleted))
		g.Expect(succeeded(r.Status.Conditions)).To(Equal("True/Restored"))
		g.Expect(r.Status.CompletionTime).NotTo(BeNil())
	}, timeout, interval).Should(Succeed())
	g.Eventually(eventsAbout(ctx, be.ns, "EtcdRestore", rs.Name), timeout, interval).Should(ContainElements("ClusterCreated", "Restored"))

	// Refusals.
	taken := newRestore(be.ns, "taken", b.Name, "orig")
	missing := newRestore(be.ns, "missing", "no-such-backup", "other")
	replace := newRestore(be.ns, "replace", b.Name, "orig")
	replace.Spec.RestoreType = etcdv1alpha1.RestoreTypeReplace
	for _, r := range []*etcdv1alpha1.EtcdRestore{taken, missing, replace} {
		g.Expect(env().Client.Create(ctx, r)).To(Succeed())
	}
	for r, reason := range map[*etcdv1alpha1.EtcdRestore]string{
		taken: controller.ReasonClusterExists, missing: controller.ReasonBackupNotFound, replace: controller.ReasonRestoreTypeNotSupported,
	} {
		g.Eventually(func(g Gomega) {
			got := getRestore(ctx, r)(g)
			g.Expect(got.Status.Phase).To(Equal(etcdv1alpha1.EtcdRestorePhaseFailed))
			g.Expect(succeeded(got.Status.Conditions)).To(Equal("False/" + reason))
		}, timeout, interval).Should(Succeed(), r.Name)
		g.Eventually(eventsAbout(ctx, be.ns, "EtcdRestore", r.Name), timeout, interval).Should(ContainElement(reason), r.Name)
	}
	orig := getCluster(ctx, &etcdv1alpha1.EtcdCluster{ObjectMeta: metav1.ObjectMeta{Namespace: be.ns, Name: "orig"}})(g)
	g.Expect(orig.Annotations).NotTo(HaveKey(controller.AnnotationRestoreSource))
	g.Expect(env().Client.Get(ctx, client.ObjectKey{Namespace: be.ns, Name: "other"}, &etcdv1alpha1.EtcdCluster{})).NotTo(Succeed())
}
