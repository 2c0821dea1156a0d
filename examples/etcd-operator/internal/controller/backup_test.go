package controller_test

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	. "github.com/onsi/gomega"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	etcdv1alpha1 "github.com/sharder-dev/sharder/examples/etcd-operator/api/v1alpha1"
	"github.com/sharder-dev/sharder/examples/etcd-operator/internal/controller"
	"github.com/sharder-dev/sharder/examples/etcd-operator/internal/etcdtest"
	"github.com/sharder-dev/sharder/examples/etcd-operator/internal/memberrestore"
	"github.com/sharder-dev/sharder/examples/etcd-operator/internal/s3test"
	"github.com/sharder-dev/sharder/internal/testenv"
)

// backupEnv is what a backup test runs against: a namespace with the store's
// credentials Secret, a real store with the bucket "backups", and a manager
// watching only that namespace.
type backupEnv struct {
	ns    string
	store *s3test.Server
}

// startBackups runs the backup and restore reconcilers (and, with clusters,
// the EtcdCluster reconciler) in a manager of one new namespace.
func startBackups(t *testing.T, endpoints func(*etcdv1alpha1.EtcdCluster, []corev1.Pod) []string, clusters bool) backupEnv {
	t.Helper()
	ctx := context.Background()
	be := backupEnv{ns: env().Namespace(t), store: s3test.Start(t)}
	be.store.MakeBucket(t, "backups")
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: be.ns, Name: "s3"},
		Data: map[string][]byte{
			controller.SecretKeyAccessKeyID:     []byte(be.store.AccessKeyID),
			controller.SecretKeySecretAccessKey: []byte(be.store.SecretAccessKey),
		},
	}
	if err := env().Client.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}

	opts := env().ManagerOptions()
	opts.Cache = cache.Options{DefaultNamespaces: map[string]cache.Config{be.ns: {}}}
	mgr := env().NewManager(t, nil, opts)
	recorder := mgr.GetEventRecorder("etcd-operator")
	if clusters {
		r := controller.NewReconciler(mgr.GetClient(), mgr.GetScheme(), recorder, controller.Options{
			APIReader: mgr.GetAPIReader(), Endpoints: endpoints, EtcdTimeout: 2 * time.Second, EtcdCheckInterval: 500 * time.Millisecond,
		})
		if err := r.SetupWithManager(mgr); err != nil {
			t.Fatal(err)
		}
	}
	b := controller.NewBackupReconciler(mgr.GetClient(), mgr.GetScheme(), recorder, controller.BackupOptions{
		APIReader: mgr.GetAPIReader(), Endpoints: endpoints, EtcdTimeout: 2 * time.Second, RetryInterval: time.Second,
	})
	if err := b.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	r := controller.NewRestoreReconciler(mgr.GetClient(), mgr.GetScheme(), recorder, controller.RestoreOptions{
		Image: "example.test/etcd-operator:test", APIReader: mgr.GetAPIReader(),
		PollInterval: 200 * time.Millisecond, RetryInterval: time.Second,
	})
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	testenv.StartManager(t, mgr)
	return be
}

func (be backupEnv) backup(name, cluster string) *etcdv1alpha1.EtcdBackup {
	return &etcdv1alpha1.EtcdBackup{
		ObjectMeta: metav1.ObjectMeta{Namespace: be.ns, Name: name},
		Spec: etcdv1alpha1.EtcdBackupSpec{
			ClusterName: cluster,
			StorageType: etcdv1alpha1.BackupStorageS3,
			S3: &etcdv1alpha1.EtcdS3BackupSpec{
				Bucket: "backups", Prefix: "etcd", Endpoint: be.store.Endpoint, CredentialsSecret: "s3",
			},
		},
	}
}

func getBackup(ctx context.Context, b *etcdv1alpha1.EtcdBackup) func(Gomega) *etcdv1alpha1.EtcdBackup {
	return func(g Gomega) *etcdv1alpha1.EtcdBackup {
		out := &etcdv1alpha1.EtcdBackup{}
		g.Expect(env().Client.Get(ctx, client.ObjectKeyFromObject(b), out)).To(Succeed())
		return out
	}
}

// succeeded is the status and reason of an object's Succeeded condition.
func succeeded(conds []metav1.Condition) string {
	c := meta.FindStatusCondition(conds, etcdv1alpha1.ConditionSucceeded)
	if c == nil {
		return "<none>"
	}
	return fmt.Sprintf("%s/%s", c.Status, c.Reason)
}

// eventsAbout lists the reasons of the events about the object of kind.
func eventsAbout(ctx context.Context, ns, kind, name string) func(Gomega) []string {
	return func(g Gomega) []string {
		list := &eventsv1.EventList{}
		g.Expect(env().Client.List(ctx, list, client.InNamespace(ns))).To(Succeed())
		var out []string
		for _, e := range list.Items {
			if e.Regarding.Kind == kind && e.Regarding.Name == name {
				out = append(out, e.Reason)
			}
		}
		return out
	}
}

func putKey(t *testing.T, endpoints []string, key, value string) {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cli.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, key, value); err != nil {
		t.Fatal(err)
	}
}

// TestOneShotBackupRestores: a one-shot backup stores a snapshot of a real
// etcd in the real store and says where, how big, at which revision and
// from which etcd version; restoring that object (as a restored member's
// init container does) gives a data directory etcd starts from with the
// key written before the backup. A compressed backup restores the same way.
func TestOneShotBackupRestores(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ctx := context.Background()
	local := etcdtest.Start(t, "source-0")
	be := startBackups(t, func(*etcdv1alpha1.EtcdCluster, []corev1.Pod) []string { return local.ClientURLs() }, false)
	putKey(t, local.ClientURLs(), "/greeting", "hello")
	g.Expect(env().Client.Create(ctx, newCluster(be.ns, "source", 1))).To(Succeed())

	for _, compressed := range []bool{false, true} {
		b := be.backup(fmt.Sprintf("once-%t", compressed), "source")
		b.Spec.Compression = compressed
		g.Expect(env().Client.Create(ctx, b)).To(Succeed())
		var got *etcdv1alpha1.EtcdBackup
		g.Eventually(func(g Gomega) {
			got = getBackup(ctx, b)(g)
			g.Expect(got.Status.Phase).To(Equal(etcdv1alpha1.EtcdBackupPhaseCompleted), "%v", got.Status.Conditions)
		}, timeout, interval).Should(Succeed())
		st := got.Status
		g.Expect(succeeded(st.Conditions)).To(Equal("True/BackupCompleted"))
		g.Expect(st.BackupSize).To(BeNumerically(">", 0))
		g.Expect(st.EtcdRevision).To(BeNumerically(">=", 2))
		g.Expect(st.EtcdVersion).To(MatchRegexp(`^3\.\d+\.\d+$`))
		g.Expect(st.StartTime).NotTo(BeNil())
		g.Expect(st.CompletionTime).NotTo(BeNil())
		suffix := ".db"
		if compressed {
			suffix = ".db.gz"
		}
		g.Expect(st.StoragePath).To(MatchRegexp(`^s3://backups/etcd/%s/%s/\d{8}T\d{6}Z%s$`, be.ns, b.Name, strings.ReplaceAll(suffix, ".", `\.`)))
		g.Eventually(eventsAbout(ctx, be.ns, "EtcdBackup", b.Name), timeout, interval).Should(ContainElement("BackupCompleted"))

		// The object holds the snapshot: restore it and read the key.
		key := strings.TrimPrefix(st.StoragePath, "s3://backups/")
		info, err := be.store.Client(t).StatObject(ctx, "backups", key, minio.StatObjectOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(info.Size).To(Equal(st.BackupSize))
		g.Expect(readRestored(t, be.store, key, "/greeting")).To(Equal("hello"))

		// Completed once: nothing more is stored.
		g.Consistently(func() ([]string, error) {
			return be.store.Keys(ctx, t, "backups", "etcd/"+be.ns+"/"+b.Name+"/")
		}, 2*time.Second, 200*time.Millisecond).Should(HaveLen(1))
	}
}

// readRestored restores the snapshot at key as a one-member cluster, starts
// etcd on the restored data and reads key there.
func readRestored(t *testing.T, store *s3test.Server, key, etcdKey string) string {
	t.Helper()
	dir := t.TempDir()
	peer, clientAddr := freeLocalAddr(t), freeLocalAddr(t)
	name := "restored-0"
	cfg := memberrestore.Config{
		Endpoint: store.Endpoint, Bucket: "backups", Key: key,
		AccessKeyID: store.AccessKeyID, SecretAccessKey: store.SecretAccessKey,
		Name: name, PeerURLs: []string{"http://" + peer},
		InitialCluster:      name + "=http://" + peer,
		InitialClusterToken: "restored",
		DataDir:             filepath.Join(dir, "data"),
	}
	restored, err := memberrestore.Run(context.Background(), cfg, zap.NewNop())
	if err != nil {
		t.Fatalf("restoring: %v", err)
	}
	if !restored {
		t.Fatal("nothing restored into an empty directory")
	}
	// A second run keeps the member's data.
	if again, err := memberrestore.Run(context.Background(), cfg, zap.NewNop()); err != nil || again {
		t.Fatalf("second restore: restored %t, %v", again, err)
	}

	ecfg := embed.NewConfig()
	ecfg.Name, ecfg.Dir = name, cfg.DataDir
	ecfg.InitialCluster, ecfg.InitialClusterToken = cfg.InitialCluster, cfg.InitialClusterToken
	pu, cu := url.URL{Scheme: "http", Host: peer}, url.URL{Scheme: "http", Host: clientAddr}
	ecfg.ListenPeerUrls, ecfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	ecfg.ListenClientUrls, ecfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	ecfg.LogLevel = "error"
	e, err := embed.StartEtcd(ecfg)
	if err != nil {
		t.Fatalf("starting etcd on the restored data: %v", err)
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(time.Minute):
		t.Fatal("etcd on the restored data did not become ready")
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{cu.String()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cli.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, etcdKey)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 {
		return ""
	}
	return string(resp.Kvs[0].Value)
}

func freeLocalAddr(t *testing.T) string {
	t.Helper()
	var lc net.ListenConfig
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().String()
}

// TestScheduledBackupKeepsNewest: a backup on a schedule of every two
// seconds takes one per tick and keeps only maxBackups snapshots in the
// store, the newest.
func TestScheduledBackupKeepsNewest(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ctx := context.Background()
	local := etcdtest.Start(t, "sched-0")
	be := startBackups(t, func(*etcdv1alpha1.EtcdCluster, []corev1.Pod) []string { return local.ClientURLs() }, false)
	g.Expect(env().Client.Create(ctx, newCluster(be.ns, "sched", 1))).To(Succeed())
	b := be.backup("every-2s", "sched")
	b.Spec.Schedule = "*/2 * * * * *"
	b.Spec.RetentionPolicy.MaxBackups = 2
	g.Expect(env().Client.Create(ctx, b)).To(Succeed())

	// Each completion is stamped differently; count them until four.
	seen := map[string]bool{}
	g.Eventually(func(g Gomega) {
		got := getBackup(ctx, b)(g)
		if got.Status.Phase == etcdv1alpha1.EtcdBackupPhaseCompleted {
			seen[got.Status.StoragePath] = true
		}
		g.Expect(seen).To(HaveLen(4))
	}, timeout, 100*time.Millisecond).Should(Succeed())

	prefix := "etcd/" + be.ns + "/" + b.Name + "/"
	g.Eventually(func(g Gomega) {
		got := getBackup(ctx, b)(g)
		keys, err := be.store.Keys(ctx, t, "backups", prefix)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(keys).To(HaveLen(2))
		// The newest is the one the status names.
		g.Expect("s3://backups/" + keys[1]).To(Equal(got.Status.StoragePath))
	}, timeout, interval).Should(Succeed())
}

// TestBackupBadInput: a backup that cannot be taken says why in its phase,
// its Succeeded condition and a Warning event, and stores nothing.
func TestBackupBadInput(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ctx := context.Background()
	local := etcdtest.Start(t, "bad-0")
	be := startBackups(t, func(*etcdv1alpha1.EtcdCluster, []corev1.Pod) []string { return local.ClientURLs() }, false)
	g.Expect(env().Client.Create(ctx, newCluster(be.ns, "bad", 1))).To(Succeed())

	cases := []struct {
		name   string
		change func(*etcdv1alpha1.EtcdBackup)
		reason string
	}{
		{"no-secret", func(b *etcdv1alpha1.EtcdBackup) { b.Spec.S3.CredentialsSecret = "missing" }, controller.ReasonCredentialsNotFound},
		{"no-bucket", func(b *etcdv1alpha1.EtcdBackup) { b.Spec.S3.Bucket = "missing" }, controller.ReasonBucketNotFound},
		{"no-cluster", func(b *etcdv1alpha1.EtcdBackup) { b.Spec.ClusterName = "missing" }, controller.ReasonClusterNotFound},
		{"bad-schedule", func(b *etcdv1alpha1.EtcdBackup) { b.Spec.Schedule = "every tuesday" }, controller.ReasonInvalidSchedule},
		{"local", func(b *etcdv1alpha1.EtcdBackup) {
			b.Spec.StorageType = etcdv1alpha1.BackupStorageLocal
			b.Spec.Local = &etcdv1alpha1.EtcdLocalBackupSpec{PersistentVolumeClaim: "data"}
		}, controller.ReasonStorageNotSupported},
	}
	for _, tc := range cases {
		b := be.backup(tc.name, "bad")
		tc.change(b)
		g.Expect(env().Client.Create(ctx, b)).To(Succeed(), tc.name)
	}
	for _, tc := range cases {
		b := be.backup(tc.name, "bad")
		g.Eventually(func(g Gomega) {
			got := getBackup(ctx, b)(g)
			g.Expect(got.Status.Phase).To(Equal(etcdv1alpha1.EtcdBackupPhaseFailed))
			g.Expect(succeeded(got.Status.Conditions)).To(Equal("False/" + tc.reason))
		}, timeout, interval).Should(Succeed(), tc.name)
		g.Eventually(eventsAbout(ctx, be.ns, "EtcdBackup", tc.name), timeout, interval).Should(ContainElement(tc.reason), tc.name)
	}
	keys, err := be.store.Keys(ctx, t, "backups", "")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(keys).To(BeEmpty())

	// Fixed input is taken up on the next retry: the Secret appears.
	secret := &corev1.Secret{}
	g.Expect(env().Client.Get(ctx, client.ObjectKey{Namespace: be.ns, Name: "s3"}, secret)).To(Succeed())
	secret.ObjectMeta = metav1.ObjectMeta{Namespace: be.ns, Name: "missing"}
	g.Expect(env().Client.Create(ctx, secret)).To(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(getBackup(ctx, be.backup("no-secret", "bad"))(g).Status.Phase).To(Equal(etcdv1alpha1.EtcdBackupPhaseCompleted))
	}, timeout, interval).Should(Succeed())
}
