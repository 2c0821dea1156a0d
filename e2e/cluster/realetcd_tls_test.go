package cluster

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
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
	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// tlsEtcdNamespace holds the EtcdCluster with TLS and auth.
const tlsEtcdNamespace = "etcd-tls"

// testRealEtcdTLS: an EtcdCluster of 3 with client and peer TLS and auth
// forms on real etcd pods while the operator instance that owns it is force
// deleted mid-formation (its replacement held back): another instance
// finishes with the Secrets the first one made, which followed the cluster
// (same CA, no certificate issued again). A client from outside with the
// issued client certificate and the root password writes and reads a key;
// without a certificate it is refused, without the password denied.
func testRealEtcdTLS(t *testing.T) {
	g := NewWithT(t)
	ctx := t.Context()
	t.Cleanup(func() {
		if t.Failed() {
			out, err := kubectl(context.Background(), "get", "etcdclusters,secrets", "--namespace", tlsEtcdNamespace, "-o", "yaml")
			t.Logf("EtcdClusters and Secrets (%v):\n%s", err, out)
			dumpState(t, tlsEtcdNamespace, "app.kubernetes.io/name=etcd")
			dumpState(t, operatorNamespace, "app.kubernetes.io/name="+operatorName)
		}
	})
	shardLabel := sharderv1alpha1.ShardLabel(operatorRing)

	By(t, "an EtcdCluster of 3 with TLS and auth")
	g.Expect(k8sClient.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tlsEtcdNamespace}})).To(Succeed())
	waitDefaultServiceAccount(ctx, g, tlsEtcdNamespace)
	ec := &etcdv1alpha1.EtcdCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: tlsEtcdNamespace, Name: "sec"},
		Spec: etcdv1alpha1.EtcdClusterSpec{
			Size:    3,
			Storage: etcdv1alpha1.EtcdStorageSpec{Ephemeral: true},
			Resources: etcdv1alpha1.EtcdResourceSpec{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
			},
			Security: etcdv1alpha1.EtcdSecuritySpec{
				TLS:  &etcdv1alpha1.EtcdTLSSpec{Client: true, Peer: true},
				Auth: &etcdv1alpha1.EtcdAuthSpec{Enabled: true},
			},
		},
	}
	g.Expect(k8sClient.Create(ctx, ec)).To(Succeed())
	start := time.Now()

	secret := func(g Gomega, name string) *corev1.Secret {
		s := &corev1.Secret{}
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: tlsEtcdNamespace, Name: name}, s)).To(Succeed())
		return s
	}
	By(t, "mid-formation, the instance that owns it is force deleted")
	var owner string
	before := map[string]*corev1.Secret{}
	g.Eventually(func(g Gomega) {
		for _, name := range []string{"sec-ca", "sec-server-tls", "sec-peer-tls", "sec-client-tls", "sec-root"} {
			before[name] = secret(g, name)
		}
		var got etcdv1alpha1.EtcdCluster
		g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(ec), &got)).To(Succeed())
		owner = got.Labels[shardLabel]
		g.Expect(owner).NotTo(BeEmpty())
	}).WithTimeout(time.Minute).WithPolling(200 * time.Millisecond).Should(Succeed())
	var got etcdv1alpha1.EtcdCluster
	g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(ec), &got)).To(Succeed())
	g.Expect(got.Status.Phase).NotTo(Equal(etcdv1alpha1.EtcdClusterPhaseRunning), "formed before its owner could be killed")
	var victim corev1.Pod
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: operatorNamespace, Name: owner}, &victim)).To(Succeed())
	// The replacement pod mounts the reconcile-log folder on the node:
	// while it is absent, the replacement cannot start, so another
	// instance must take the cluster over. It is made again once the
	// cluster runs (the operator's running pods keep the folder they
	// mounted, and lose nothing this scenario checks).
	var logDirs []string
	for _, v := range victim.Spec.Volumes {
		if v.HostPath != nil {
			logDirs = append(logDirs, v.HostPath.Path)
			g.Expect(os.RemoveAll(v.HostPath.Path)).To(Succeed())
		}
	}
	t.Logf("owner %s killed %s after creation", owner, time.Since(start).Round(100*time.Millisecond))
	if _, err := kubectl(ctx, "delete", "pod", "--namespace", operatorNamespace, owner, "--force", "--grace-period=0"); err != nil {
		t.Fatal(err)
	}

	By(t, "Running, with certificates and auth reported, on the Secrets made before")
	g.Eventually(func(g Gomega) {
		g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(ec), &got)).To(Succeed())
		ready := meta.FindStatusCondition(got.Status.Conditions, etcdv1alpha1.ConditionReady)
		g.Expect(ready).NotTo(BeNil())
		g.Expect(got.Status.Phase).To(Equal(etcdv1alpha1.EtcdClusterPhaseRunning), "Ready: %s", ready.Message)
		g.Expect(ready.Status).To(Equal(metav1.ConditionTrue), ready.Message)
		for _, typ := range []string{etcdv1alpha1.ConditionCertificatesReady, etcdv1alpha1.ConditionAuthEnabled} {
			cond := meta.FindStatusCondition(got.Status.Conditions, typ)
			g.Expect(cond).NotTo(BeNil(), typ)
			g.Expect(cond.Status).To(Equal(metav1.ConditionTrue), "%s: %s", typ, cond.Message)
		}
	}).WithTimeout(3 * time.Minute).WithPolling(time.Second).Should(Succeed())
	t.Logf("Running after %s, on %s (killed: %s)", time.Since(start).Round(time.Second), got.Labels[shardLabel], owner)
	g.Expect(got.Labels[shardLabel]).NotTo(Equal(owner), "another instance finished")
	var now corev1.Pod
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: operatorNamespace, Name: owner}, &now)).To(Succeed())
	g.Expect(now.UID).NotTo(Equal(victim.UID), "the killed instance's pod was replaced")
	for name, old := range before {
		cur := secret(g, name)
		g.Expect(cur.UID).To(Equal(old.UID), "%s was made again", name)
		g.Expect(cur.Data).To(Equal(old.Data), "%s was issued again", name)
		g.Expect(cur.Labels).To(HaveKeyWithValue(shardLabel, got.Labels[shardLabel]), "%s follows its cluster", name)
	}

	By(t, "a client with the issued certificate and the root password writes and reads; without them it is refused")
	var svc corev1.Service
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: tlsEtcdNamespace, Name: "sec-client"}, &svc)).To(Succeed())
	endpoint := "https://" + net.JoinHostPort(svc.Spec.ClusterIP, strconv.Itoa(int(svc.Spec.Ports[0].Port)))
	clientSecret := secret(g, "sec-client-tls")
	pool := x509.NewCertPool()
	g.Expect(pool.AppendCertsFromPEM(clientSecret.Data["ca.crt"])).To(BeTrue())
	g.Expect(bytes.Equal(clientSecret.Data["ca.crt"], before["sec-ca"].Data["tls.crt"])).To(BeTrue())
	pair, err := tls.X509KeyPair(clientSecret.Data["tls.crt"], clientSecret.Data["tls.key"])
	g.Expect(err).NotTo(HaveOccurred())
	password := string(secret(g, "sec-root").Data["password"])
	use := func(withCert bool, user, pass string) error {
		cfg := verifiedAs(pool, "sec-client."+tlsEtcdNamespace+".svc")
		if withCert {
			cfg.Certificates = []tls.Certificate{pair}
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, TLS: cfg,
			Username: user, Password: pass, Logger: zap.NewNop(), Context: cctx})
		if err != nil {
			return err
		}
		defer func() { _ = cli.Close() }()
		value := fmt.Sprintf("written at %s", time.Now().UTC().Format(time.RFC3339Nano))
		if _, err := cli.Put(cctx, "/e2e/tls", value); err != nil {
			return err
		}
		resp, err := cli.Get(cctx, "/e2e/tls")
		if err != nil {
			return err
		}
		if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != value {
			return fmt.Errorf("read back %v, want %q", resp.Kvs, value)
		}
		return nil
	}
	g.Expect(use(true, "root", password)).To(Succeed())
	g.Expect(use(false, "root", password)).NotTo(Succeed(), "without a client certificate")
	g.Expect(use(true, "", "")).To(MatchError(ContainSubstring("permission denied")), "without the password")

	// The replacement may start now (and may take the cluster back). The
	// kubelet retries the missing volume with a growing backoff: a new pod
	// mounts it at once.
	for _, dir := range logDirs {
		g.Expect(os.MkdirAll(dir, 0o777)).To(Succeed())
		g.Expect(os.Chmod(dir, 0o777)).To(Succeed())
	}
	if _, err := kubectl(ctx, "delete", "pod", "--namespace", operatorNamespace, owner, "--wait=false"); err != nil {
		t.Fatal(err)
	}
	By(t, "deleted, the cluster goes with its members and Secrets")
	g.Expect(k8sClient.Delete(ctx, ec)).To(Succeed())
	g.Eventually(func(g Gomega) {
		var pods corev1.PodList
		g.Expect(k8sClient.List(ctx, &pods, client.InNamespace(tlsEtcdNamespace))).To(Succeed())
		g.Expect(pods.Items).To(BeEmpty())
		var secrets corev1.SecretList
		g.Expect(k8sClient.List(ctx, &secrets, client.InNamespace(tlsEtcdNamespace), client.HasLabels{"etcd.example.sharder.dev/cluster"})).To(Succeed())
		g.Expect(secrets.Items).To(BeEmpty())
		err := k8sClient.Get(ctx, client.ObjectKeyFromObject(ec), &etcdv1alpha1.EtcdCluster{})
		g.Expect(client.IgnoreNotFound(err)).To(Succeed())
		g.Expect(err).To(HaveOccurred())
	}).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
	By(t, "the operator's 4 instances are ready again")
	waitStatefulSetReady(ctx, g, operatorNamespace, operatorName, 4)
	t.Logf("TLS scenario took %s", time.Since(start).Round(time.Second))
}

// verifiedAs is a client TLS configuration that trusts roots and verifies
// the server by name: the test dials the client Service's IP (it cannot
// resolve the cluster's DNS names), and gRPC verifies a server by the
// address it dials whatever ServerName says, so the check is done here.
func verifiedAs(roots *x509.CertPool, name string) *tls.Config {
	return &tls.Config{
		RootCAs:            roots,
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: true, // verified in VerifyConnection
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return fmt.Errorf("no server certificate")
			}
			opts := x509.VerifyOptions{Roots: roots, DNSName: name, Intermediates: x509.NewCertPool()}
			for _, c := range cs.PeerCertificates[1:] {
				opts.Intermediates.AddCert(c)
			}
			_, err := cs.PeerCertificates[0].Verify(opts)
			return err
		},
	}
}
