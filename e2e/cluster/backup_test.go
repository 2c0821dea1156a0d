package cluster

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	. "github.com/onsi/gomega"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	etcdv1alpha1 "github.com/sharder-dev/sharder/examples/etcd-operator/api/v1alpha1"
	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// The S3 store the backup scenario deploys (make images builds its image).
const (
	storeNamespace = "s3-store"
	storeImage     = "ghcr.io/sharder-dev/versitygw:v1.8.0"
	storeAccessKey = "e2e-access"
	storeSecretKey = "e2e-secret-key"
	backupNS       = "etcd-backup"
)

// testBackupRestore: the S3 store (versitygw) runs in the cluster; an
// EtcdCluster of 3 with a key (and 48 MiB beside it, so that the
// snapshot takes a moment) is backed up while the operator instance the
// EtcdBackup is assigned to is force-deleted as soon as it reports the
// backup Running; another instance completes it, and the store holds
// exactly one whole snapshot. The cluster is deleted; an EtcdRestore of the
// backup brings back a cluster of the same name whose members restore the
// snapshot, and the key reads back.
func testBackupRestore(t *testing.T) {
	g := NewWithT(t)
	ctx := t.Context()
	t.Cleanup(func() {
		if t.Failed() {
			for _, kind := range []string{"etcdbackups", "etcdrestores", "etcdclusters"} {
				out, err := kubectl(context.Background(), "get", kind, "--namespace", backupNS, "-o", "yaml")
				t.Logf("%s (%v):\n%s", kind, err, out)
			}
			dumpState(t, storeNamespace, "app.kubernetes.io/name=versitygw")
			dumpState(t, backupNS, "app.kubernetes.io/name=etcd")
			dumpState(t, operatorNamespace, "app.kubernetes.io/name="+operatorName)
		}
	})
	begin := time.Now()

	By(t, "the S3 store runs in the cluster, with a bucket")
	endpoint := deployStore(ctx, t, g)
	// One request per attempt: a retry of a creation that timed out on a
	// loaded node would race the first.
	store, err := minio.New(strings.TrimPrefix(endpoint, "http://"), &minio.Options{
		Creds: credentials.NewStaticV4(storeAccessKey, storeSecretKey, ""), MaxRetries: 1,
	})
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(func(g Gomega) {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		ok, err := store.BucketExists(cctx, "backups")
		g.Expect(err).NotTo(HaveOccurred())
		if !ok {
			g.Expect(store.MakeBucket(cctx, "backups", minio.MakeBucketOptions{})).To(Succeed())
		}
	}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())

	By(t, "an EtcdCluster of 3 with a key")
	g.Expect(k8sClient.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: backupNS}})).To(Succeed())
	waitDefaultServiceAccount(ctx, g, backupNS)
	g.Expect(k8sClient.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: backupNS, Name: "s3"},
		StringData: map[string]string{"AWS_ACCESS_KEY_ID": storeAccessKey, "AWS_SECRET_ACCESS_KEY": storeSecretKey},
	})).To(Succeed())
	spec := etcdv1alpha1.EtcdClusterSpec{
		Size:    3,
		Storage: etcdv1alpha1.EtcdStorageSpec{Ephemeral: true},
		Resources: etcdv1alpha1.EtcdResourceSpec{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
		},
	}
	ec := &etcdv1alpha1.EtcdCluster{ObjectMeta: metav1.ObjectMeta{Namespace: backupNS, Name: "kv"}, Spec: spec}
	g.Expect(k8sClient.Create(ctx, ec)).To(Succeed())
	waitRunning(ctx, g, ec)
	value := "written at " + time.Now().UTC().Format(time.RFC3339Nano)
	withEtcd(ctx, g, ec, func(cli *clientv3.Client) {
		// Retried: the client Service may route to a member that only
		// just started.
		put := func(key, value string) {
			g.Eventually(func() error {
				cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				_, err := cli.Put(cctx, key, value)
				return err
			}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed(), key)
		}
		put("/e2e/key", value)
		filler := strings.Repeat("x", 1<<20)
		for i := range 48 {
			put(fmt.Sprintf("/e2e/filler/%d", i), filler)
		}
	})
	t.Logf("cluster Running with the key after %s", time.Since(begin).Round(time.Second))

	By(t, "an EtcdBackup, its instance force-deleted once it runs")
	b := &etcdv1alpha1.EtcdBackup{
		ObjectMeta: metav1.ObjectMeta{Namespace: backupNS, Name: "kv-backup"},
		Spec: etcdv1alpha1.EtcdBackupSpec{
			ClusterName: "kv",
			StorageType: etcdv1alpha1.BackupStorageS3,
			S3: &etcdv1alpha1.EtcdS3BackupSpec{
				Bucket: "backups", Endpoint: "http://s3." + storeNamespace + ".svc:7070", CredentialsSecret: "s3",
			},
		},
	}
	g.Expect(k8sClient.Create(ctx, b)).To(Succeed())
	var victim string
	g.Eventually(func(g Gomega) {
		var got etcdv1alpha1.EtcdBackup
		g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(b), &got)).To(Succeed())
		g.Expect(got.Status.Phase).NotTo(BeEmpty())
		victim = got.Labels[sharderv1alpha1.ShardLabel(operatorRing)]
		g.Expect(victim).NotTo(BeEmpty())
	}).WithTimeout(time.Minute).WithPolling(20 * time.Millisecond).Should(Succeed())
	var phaseAtKill etcdv1alpha1.EtcdBackupPhase
	{
		var got etcdv1alpha1.EtcdBackup
		g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(b), &got)).To(Succeed())
		phaseAtKill = got.Status.Phase
	}
	_, err = kubectl(ctx, "delete", "pod", "--namespace", operatorNamespace, victim, "--force", "--grace-period=0", "--wait=false")
	g.Expect(err).NotTo(HaveOccurred())
	t.Logf("force-deleted %s with the backup %s", victim, phaseAtKill)

	var done etcdv1alpha1.EtcdBackup
	g.Eventually(func(g Gomega) {
		g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(b), &done)).To(Succeed())
		g.Expect(done.Status.Phase).To(Equal(etcdv1alpha1.EtcdBackupPhaseCompleted), "%v", done.Status.Conditions)
	}).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
	t.Logf("backup Completed by %s: %d bytes at revision %d, %s; events %v", done.Labels[sharderv1alpha1.ShardLabel(operatorRing)],
		done.Status.BackupSize, done.Status.EtcdRevision, done.Status.StoragePath, backupEvents(ctx, g, b.Name))
	g.Expect(done.Status.BackupSize).To(BeNumerically(">", 48<<20))
	// Exactly one object, whole: an attempt cut short stored nothing.
	var keys []string
	for obj := range store.ListObjects(ctx, "backups", minio.ListObjectsOptions{Recursive: true}) {
		g.Expect(obj.Err).NotTo(HaveOccurred())
		keys = append(keys, obj.Key)
		g.Expect(obj.Size).To(Equal(done.Status.BackupSize))
	}
	g.Expect(keys).To(HaveLen(1))
	g.Expect("s3://backups/" + keys[0]).To(Equal(done.Status.StoragePath))

	By(t, "the EtcdCluster deleted")
	g.Expect(k8sClient.Delete(ctx, ec)).To(Succeed())
	g.Eventually(func(g Gomega) {
		var pods corev1.PodList
		g.Expect(k8sClient.List(ctx, &pods, client.InNamespace(backupNS), client.MatchingLabels{"app.kubernetes.io/name": "etcd"})).To(Succeed())
		g.Expect(pods.Items).To(BeEmpty())
		err := k8sClient.Get(ctx, client.ObjectKeyFromObject(ec), &etcdv1alpha1.EtcdCluster{})
		g.Expect(client.IgnoreNotFound(err)).To(Succeed())
		g.Expect(err).To(HaveOccurred())
	}).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())

	By(t, "an EtcdRestore brings it back with the key")
	rs := &etcdv1alpha1.EtcdRestore{
		ObjectMeta: metav1.ObjectMeta{Namespace: backupNS, Name: "kv-restore"},
		Spec: etcdv1alpha1.EtcdRestoreSpec{
			BackupName: b.Name, ClusterName: "kv", RestoreType: etcdv1alpha1.RestoreTypeNew, ClusterTemplate: spec.DeepCopy(),
		},
	}
	restoreStart := time.Now()
	g.Expect(k8sClient.Create(ctx, rs)).To(Succeed())
	g.Eventually(func(g Gomega) {
		var got etcdv1alpha1.EtcdRestore
		g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(rs), &got)).To(Succeed())
		g.Expect(got.Status.Phase).To(Equal(etcdv1alpha1.EtcdRestorePhaseCompleted), "%v", got.Status.Conditions)
	}).WithTimeout(3 * time.Minute).WithPolling(time.Second).Should(Succeed())
	t.Logf("restore Completed after %s", time.Since(restoreStart).Round(time.Second))
	restored := &etcdv1alpha1.EtcdCluster{ObjectMeta: metav1.ObjectMeta{Namespace: backupNS, Name: "kv"}}
	waitRunning(ctx, g, restored)
	withEtcd(ctx, g, restored, func(cli *clientv3.Client) {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		resp, err := cli.Get(cctx, "/e2e/key")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(resp.Kvs).To(HaveLen(1))
		g.Expect(string(resp.Kvs[0].Value)).To(Equal(value))
	})

	g.Expect(k8sClient.Delete(ctx, restored)).To(Succeed())
	t.Logf("backup and restore scenario took %s", time.Since(begin).Round(time.Second))
}

// deployStore runs versitygw (posix backend on emptyDir volumes) behind the
// Service s3 and returns its URL through the Service's cluster IP.
func deployStore(ctx context.Context, t *testing.T, g Gomega) string {
	t.Helper()
	labels := map[string]string{"app.kubernetes.io/name": "versitygw"}
	g.Expect(k8sClient.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: storeNamespace}})).To(Succeed())
	waitDefaultServiceAccount(ctx, g, storeNamespace)
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: storeNamespace, Name: "s3", Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					Containers: []corev1.Container{{
						Name:  "versitygw",
						Image: storeImage,
						// Not --quiet: a failed test dumps the store's log, and
						// its request log says which requests failed and how.
						Args: []string{"--port", ":7070", "--health", "/health", "posix", "--sidecar", "/meta", "/buckets"},
						Env: []corev1.EnvVar{
							{Name: "ROOT_ACCESS_KEY", Value: storeAccessKey},
							{Name: "ROOT_SECRET_KEY", Value: storeSecretKey},
						},
						Ports: []corev1.ContainerPort{{Name: "s3", ContainerPort: 7070}},
						ReadinessProbe: &corev1.Probe{
							ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/health", Port: intstr.FromString("s3")}},
							PeriodSeconds: 1,
						},
						VolumeMounts: []corev1.VolumeMount{{Name: "buckets", MountPath: "/buckets"}, {Name: "meta", MountPath: "/meta"}},
					}},
					Volumes: []corev1.Volume{
						{Name: "buckets", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
						{Name: "meta", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
					},
				},
			},
		},
	}
	g.Expect(k8sClient.Create(ctx, dep)).To(Succeed())
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: storeNamespace, Name: "s3", Labels: labels},
		Spec: corev1.ServiceSpec{
			Selector: labels,
			Ports:    []corev1.ServicePort{{Name: "s3", Port: 7070, TargetPort: intstr.FromString("s3")}},
		},
	}
	g.Expect(k8sClient.Create(ctx, svc)).To(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(dep), dep)).To(Succeed())
		g.Expect(dep.Status.ReadyReplicas).To(Equal(int32(1)))
	}).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
	return "http://" + net.JoinHostPort(svc.Spec.ClusterIP, "7070")
}

func waitRunning(ctx context.Context, g Gomega, ec *etcdv1alpha1.EtcdCluster) {
	g.Eventually(func(g Gomega) {
		var got etcdv1alpha1.EtcdCluster
		g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(ec), &got)).To(Succeed())
		g.Expect(got.Status.Phase).To(Equal(etcdv1alpha1.EtcdClusterPhaseRunning), "%v", got.Status.Conditions)
	}).WithTimeout(3 * time.Minute).WithPolling(time.Second).Should(Succeed())
}

// withEtcd calls f with a client of ec's etcd through its client Service.
func withEtcd(ctx context.Context, g Gomega, ec *etcdv1alpha1.EtcdCluster, f func(*clientv3.Client)) {
	var svc corev1.Service
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ec.Namespace, Name: ec.Name + "-client"}, &svc)).To(Succeed())
	endpoint := "http://" + net.JoinHostPort(svc.Spec.ClusterIP, strconv.Itoa(int(svc.Spec.Ports[0].Port)))
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		MaxCallSendMsgSize: 2 << 20})
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = cli.Close() }()
	f(cli)
}

// backupEvents lists the reasons of the events about the backup, in order.
func backupEvents(ctx context.Context, g Gomega, name string) string {
	var list eventsv1.EventList
	g.Expect(k8sClient.List(ctx, &list, client.InNamespace(backupNS))).To(Succeed())
	var out bytes.Buffer
	for _, e := range list.Items {
		if e.Regarding.Kind == "EtcdBackup" && e.Regarding.Name == name {
			fmt.Fprintf(&out, "%s(%s) ", e.Reason, e.ReportingInstance)
		}
	}
	return out.String()
}
