package controller_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	etcdv1alpha1 "github.com/sharder-dev/sharder/examples/etcd-operator/api/v1alpha1"
	"github.com/sharder-dev/sharder/examples/etcd-operator/internal/controller"
	"github.com/sharder-dev/sharder/examples/etcd-operator/internal/etcdtest"
)

// secretVolume plays the kubelet for one Secret: it writes the Secret's keys
// as files into dir and replaces them all at once (a symlink swap, as the
// kubelet does) whenever the Secret changes, until the test ends.
type secretVolume struct {
	dir     string
	mu      sync.Mutex
	version string
}

func newSecretVolume(t *testing.T, dir string) *secretVolume {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return &secretVolume{dir: dir}
}

// sync writes s's data if its resourceVersion is new; it reports whether
// the files exist.
func (v *secretVolume) sync(s *corev1.Secret) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if s.ResourceVersion == v.version {
		return nil
	}
	data := filepath.Join(v.dir, "..v"+s.ResourceVersion)
	if err := os.MkdirAll(data, 0o700); err != nil {
		return err
	}
	for k, val := range s.Data {
		if err := os.WriteFile(filepath.Join(data, k), val, 0o600); err != nil {
			return err
		}
	}
	tmp := filepath.Join(v.dir, "..data_tmp")
	_ = os.Remove(tmp)
	if err := os.Symlink(filepath.Base(data), tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(v.dir, "..data")); err != nil {
		return err
	}
	for k := range s.Data {
		link := filepath.Join(v.dir, k)
		if _, err := os.Lstat(link); err == nil {
			continue
		}
		if err := os.Symlink(filepath.Join("..data", k), link); err != nil {
			return err
		}
	}
	v.version = s.ResourceVersion
	return nil
}

// tlsEtcd runs, for one EtcdCluster with TLS, a real local etcd of three
// members that use the certificates the operator issued, from files kept
// in step with the Secrets; until it answers, the cluster has no address.
type tlsEtcd struct {
	mu     sync.Mutex
	local  *etcdtest.Cluster
	server *secretVolume
	peer   *secretVolume
}

func startTLSEtcd(ctx context.Context, t *testing.T, ns, name string) *tlsEtcd {
	dir := t.TempDir()
	e := &tlsEtcd{server: newSecretVolume(t, filepath.Join(dir, "server")), peer: newSecretVolume(t, filepath.Join(dir, "peer"))}
	syncAll := func() error {
		for vol, secret := range map[*secretVolume]string{e.server: name + "-server-tls", e.peer: name + "-peer-tls"} {
			s := &corev1.Secret{}
			if err := env().Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: secret}, s); err != nil {
				return err
			}
			if err := vol.sync(s); err != nil {
				return err
			}
		}
		return nil
	}
	go func() {
		// The kubelet's refresh, much faster.
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				_ = syncAll()
			}
		}
	}()
	go func() {
		for syncAll() != nil {
			select {
			case <-ctx.Done():
				return
			case <-time.After(interval):
			}
		}
		local, err := etcdtest.StartWith(ctx, t, etcdtest.Options{ServerDir: e.server.dir, PeerDir: e.peer.dir}, name+"-0", name+"-1", name+"-2")
		if err != nil {
			if ctx.Err() == nil {
				t.Errorf("etcd for %s: %v", name, err)
			}
			return
		}
		e.mu.Lock()
		e.local = local
		e.mu.Unlock()
	}()
	return e
}

func (e *tlsEtcd) endpoints(*etcdv1alpha1.EtcdCluster, []corev1.Pod) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.local == nil {
		return nil
	}
	return e.local.ClientURLs()
}

func secretData(ctx context.Context, g Gomega, ns, name string) map[string][]byte {
	s := &corev1.Secret{}
	g.Expect(env().Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, s)).To(Succeed())
	return s.Data
}

func parseCert(g Gomega, pemData []byte) *x509.Certificate {
	block, _ := pem.Decode(pemData)
	g.Expect(block).NotTo(BeNil())
	c, err := x509.ParseCertificate(block.Bytes)
	g.Expect(err).NotTo(HaveOccurred())
	return c
}

// TestIssuedCertificatesAndAuth runs an EtcdCluster with TLS and auth on
// real etcd members that use the certificates the operator issued: the
// operator reaches Running with its client certificate and the root
// password; a client without a certificate is refused, one with a
// certificate but without the password is denied; the certificates are
// renewed before they expire, the members pick the new ones up, and the
// cluster keeps serving past the end of the first ones, a member restarted
// then rejoining with the new peer certificates.
//
// Not parallel, unlike most tests here: its clients dial etcd once each,
// within 3 s, which the other tests' etcd members and operators running
// beside it on a loaded machine could make it miss.
func TestIssuedCertificatesAndAuth(t *testing.T) {
	g := NewWithT(t)
	ctx := t.Context()
	ns := env().Namespace(t)
	const name = "sec"
	local := startTLSEtcd(ctx, t, ns, name)
	startManager(t, controller.Options{Endpoints: local.endpoints}, inNamespace(ns))

	c := newCluster(ns, name, 3)
	c.Spec.Security = etcdv1alpha1.EtcdSecuritySpec{
		TLS: &etcdv1alpha1.EtcdTLSSpec{
			Client: true, Peer: true,
			// Renewed every 8s; the first certificates end 24s after issue.
			Validity:    &metav1.Duration{Duration: 24 * time.Second},
			RenewBefore: &metav1.Duration{Duration: 16 * time.Second},
		},
		Auth: &etcdv1alpha1.EtcdAuthSpec{Enabled: true},
	}
	g.Expect(env().Client.Create(ctx, c)).To(Succeed())
	setReadyReplicas(ctx, g, ns, name, 3)

	t.Log("Running, with certificates and auth reported")
	var got *etcdv1alpha1.EtcdCluster
	g.Eventually(func(g Gomega) {
		got = getCluster(ctx, c)(g)
		g.Expect(got).To(And(
			havePhase(etcdv1alpha1.EtcdClusterPhaseRunning),
			haveCondition(etcdv1alpha1.ConditionCertificatesReady, metav1.ConditionTrue, etcdv1alpha1.ReasonCertificatesIssued),
			haveCondition(etcdv1alpha1.ConditionAuthEnabled, metav1.ConditionTrue, etcdv1alpha1.ReasonAuthEnabled),
		))
	}, timeout, interval).Should(Succeed())
	g.Expect(got.Status.CertificatesNotAfter).NotTo(BeNil())
	g.Expect(eventReasons(ctx, c)(g)).To(ContainElements("SecretCreated", "AuthEnabled"))

	t.Log("the Secrets belong to the cluster; members are named by the server certificate, clients carry no names")
	for _, s := range []string{"-ca", "-server-tls", "-peer-tls", "-client-tls", "-root"} {
		secret := &corev1.Secret{}
		g.Expect(env().Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name + s}, secret)).To(Succeed())
		ref := metav1.GetControllerOf(secret)
		g.Expect(ref).NotTo(BeNil(), s)
		g.Expect(ref.UID).To(Equal(got.UID), s)
	}
	server := parseCert(g, secretData(ctx, g, ns, name+"-server-tls")["tls.crt"])
	g.Expect(server.DNSNames).To(ContainElements("*.sec-peer."+ns+".svc", "sec-client."+ns+".svc"))
	clientData := secretData(ctx, g, ns, name+"-client-tls")
	clientCert := parseCert(g, clientData["tls.crt"])
	g.Expect(clientCert.DNSNames).To(BeEmpty())
	g.Expect(clientCert.IPAddresses).To(BeEmpty())
	caPEM := secretData(ctx, g, ns, name+"-ca")["tls.crt"]
	password := string(secretData(ctx, g, ns, name+"-root")["password"])

	pool := x509.NewCertPool()
	g.Expect(pool.AppendCertsFromPEM(caPEM)).To(BeTrue())
	dial := func(withCert bool, user, pass string) error {
		cfg := &tls.Config{RootCAs: pool, ServerName: "sec-client." + ns + ".svc", MinVersion: tls.VersionTLS12}
		if withCert {
			pair, err := tls.X509KeyPair(secretData(ctx, g, ns, name+"-client-tls")["tls.crt"], secretData(ctx, g, ns, name+"-client-tls")["tls.key"])
			g.Expect(err).NotTo(HaveOccurred())
			cfg.Certificates = []tls.Certificate{pair}
		}
		cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		cli, err := clientv3.New(clientv3.Config{Endpoints: local.endpoints(nil, nil), DialTimeout: 2 * time.Second, TLS: cfg,
			Username: user, Password: pass, Logger: zap.NewNop(), Context: cctx})
		if err != nil {
			return err
		}
		defer func() { _ = cli.Close() }()
		key := fmt.Sprintf("/test/%d", time.Now().UnixNano())
		if _, err := cli.Put(cctx, key, "v"); err != nil {
			return err
		}
		resp, err := cli.Get(cctx, key)
		if err != nil {
			return err
		}
		if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v" {
			return fmt.Errorf("read back %v", resp.Kvs)
		}
		return nil
	}
	t.Log("a client with the client certificate and the root password writes and reads")
	g.Expect(dial(true, "root", password)).To(Succeed())
	t.Log("a client without a certificate is refused; one without the password is denied")
	g.Expect(dial(false, "root", password)).NotTo(Succeed())
	err := dial(true, "", "")
	g.Expect(err).To(HaveOccurred())
	g.Expect(err.Error()).To(ContainSubstring("permission denied"))
	g.Expect(dial(true, "root", "wrong")).NotTo(Succeed())

	t.Log("the certificates are renewed before they expire, and members serve the new ones")
	firstEnd := server.NotAfter
	g.Eventually(func(g Gomega) {
		renewed := parseCert(g, secretData(ctx, g, ns, name+"-server-tls")["tls.crt"])
		g.Expect(renewed.SerialNumber).NotTo(Equal(server.SerialNumber))
		g.Expect(bytes.Equal(secretData(ctx, g, ns, name+"-ca")["tls.crt"], caPEM)).To(BeTrue(), "the CA stays")
		// A new connection gets the renewed certificate (the files
		// changed under the running member).
		u, err := url.Parse(local.endpoints(nil, nil)[0])
		g.Expect(err).NotTo(HaveOccurred())
		conn, err := tls.Dial("tcp", u.Host, &tls.Config{RootCAs: pool, ServerName: "sec-client." + ns + ".svc", MinVersion: tls.VersionTLS12})
		g.Expect(err).NotTo(HaveOccurred())
		defer func() { _ = conn.Close() }()
		g.Expect(conn.ConnectionState().PeerCertificates[0].NotAfter).To(BeTemporally(">", firstEnd))
	}, timeout, interval).Should(Succeed())
	g.Expect(eventReasons(ctx, c)(g)).To(ContainElement("CertificateRenewed"))

	t.Log("past the end of the first certificates, the cluster serves and a restarted member rejoins")
	g.Eventually(time.Now, timeout, interval).Should(BeTemporally(">", firstEnd.Add(time.Second)))
	local.mu.Lock()
	members := local.local
	local.mu.Unlock()
	members.Stop(0)
	members.Restart(0)
	g.Eventually(func(g Gomega) {
		got = getCluster(ctx, c)(g)
		g.Expect(got).To(And(
			havePhase(etcdv1alpha1.EtcdClusterPhaseRunning),
			haveCondition(etcdv1alpha1.ConditionReady, metav1.ConditionTrue, etcdv1alpha1.ReasonMembersReady),
		))
		g.Expect(got.Status.HealthyMembers).To(BeEquivalentTo(3))
		g.Expect(got.Status.CertificatesNotAfter.Time).To(BeTemporally(">", time.Now()))
		g.Expect(dial(true, "root", password)).To(Succeed())
	}, timeout, interval).Should(Succeed())
}

// TestUserProvidedCertificates: with source Secrets the operator issues
// nothing; a missing Secret is reported (CertificatesReady False
// SecretInvalid, a warning event), and once the Secrets exist and verify
// the condition turns True and the members mount them.
func TestUserProvidedCertificates(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ctx := t.Context()
	ns := env().Namespace(t)
	startManager(t, controller.Options{Endpoints: func(*etcdv1alpha1.EtcdCluster, []corev1.Pod) []string { return nil }}, inNamespace(ns))

	// Certificates from a CA: those the operator issued for another cluster.
	source := newCluster(ns, "issuer", 1)
	source.Spec.Security.TLS = &etcdv1alpha1.EtcdTLSSpec{Client: true, Peer: true}
	g.Expect(env().Client.Create(ctx, source)).To(Succeed())
	issued := map[string]map[string][]byte{}
	g.Eventually(func(g Gomega) {
		for _, role := range []string{"server", "peer", "client"} {
			issued[role] = secretData(ctx, g, ns, "issuer-"+role+"-tls")
		}
	}, timeout, interval).Should(Succeed())

	c := newCluster(ns, "mine", 1)
	c.Spec.Security.TLS = &etcdv1alpha1.EtcdTLSSpec{Client: true, Peer: true, Source: etcdv1alpha1.CertificateSourceSecrets,
		Secrets: &etcdv1alpha1.EtcdTLSSecrets{Server: "my-server", Peer: "my-peer", Client: "my-client"}}
	g.Expect(env().Client.Create(ctx, c)).To(Succeed())
	g.Eventually(func(g Gomega) {
		got := getCluster(ctx, c)(g)
		g.Expect(got).To(haveCondition(etcdv1alpha1.ConditionCertificatesReady, metav1.ConditionFalse, etcdv1alpha1.ReasonSecretInvalid))
		g.Expect(eventReasons(ctx, c)(g)).To(ContainElement(etcdv1alpha1.ReasonSecretInvalid))
	}, timeout, interval).Should(Succeed())

	for role, name := range map[string]string{"server": "my-server", "peer": "my-peer", "client": "my-client"} {
		g.Expect(env().Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Type: corev1.SecretTypeTLS, Data: issued[role]})).To(Succeed())
	}
	g.Eventually(func(g Gomega) {
		got := getCluster(ctx, c)(g)
		g.Expect(got).To(haveCondition(etcdv1alpha1.ConditionCertificatesReady, metav1.ConditionTrue, etcdv1alpha1.ReasonCertificatesProvided))
		g.Expect(got.Status.CertificatesNotAfter).NotTo(BeNil())
	}, timeout, interval).Should(Succeed())
	sts := &appsv1.StatefulSet{}
	g.Expect(env().Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "mine"}, sts)).To(Succeed())
	g.Expect(sts.Spec.Template.Spec.Volumes).To(ContainElements(
		HaveField("VolumeSource.Secret.SecretName", "my-server"),
		HaveField("VolumeSource.Secret.SecretName", "my-peer"),
	))
	for _, suffix := range []string{"-ca", "-server-tls", "-peer-tls", "-client-tls"} {
		err := env().Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "mine" + suffix}, &corev1.Secret{})
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "mine%s: %v", suffix, err)
	}
}
