package controller

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
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
	"github.com/sharder-dev/sharder/internal/testenv"
)

func tlsCluster() *etcdv1alpha1.EtcdCluster {
	c := &etcdv1alpha1.EtcdCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "db", Name: "solo", UID: "u1"}}
	c.Spec.Size = 1
	c.Spec.Security.TLS = &etcdv1alpha1.EtcdTLSSpec{Client: true, Peer: true}
	return c
}

// TestReissueReason: a certificate is issued again when it is missing, from
// another CA, names other hosts, or within renewBefore of its end; not
// otherwise.
func TestReissueReason(t *testing.T) {
	g := NewWithT(t)
	c := tlsCluster()
	now := time.Now()
	ca, err := newCA(c, now, 10*time.Hour)
	g.Expect(err).NotTo(HaveOccurred())
	other, err := newCA(c, now, 10*time.Hour)
	g.Expect(err).NotTo(HaveOccurred())
	leaf, err := issue(c, roleServer, ca, now, time.Hour)
	g.Expect(err).NotTo(HaveOccurred())
	data := map[string][]byte{keyCert: leaf.certPEM, keyKey: leaf.keyPEM, keyCA: ca.certPEM}

	g.Expect(reissueReason(c, roleServer, ca, data, now, 10*time.Minute)).To(BeEmpty())
	g.Expect(reissueReason(c, roleServer, ca, nil, now, 10*time.Minute)).To(Equal("no certificate yet"))
	g.Expect(reissueReason(c, roleServer, other, data, now, 10*time.Minute)).To(Equal("its CA changed"))
	g.Expect(reissueReason(c, roleClient, ca, data, now, 10*time.Minute)).To(Equal("it names other hosts"))
	g.Expect(reissueReason(c, roleServer, ca, data, now.Add(51*time.Minute), 10*time.Minute)).To(HavePrefix("it expires at"))
	bad := map[string][]byte{keyCert: leaf.certPEM, keyKey: other.keyPEM, keyCA: ca.certPEM}
	g.Expect(reissueReason(c, roleServer, ca, bad, now, 10*time.Minute)).To(HavePrefix("the certificate is unreadable"))

	g.Expect(leaf.cert.DNSNames).To(ContainElements("*.solo-peer.db.svc", "solo-client.db.svc", "localhost"))
	client, err := issue(c, roleClient, ca, now, 100*time.Hour)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(client.cert.DNSNames).To(BeEmpty())
	g.Expect(client.cert.IPAddresses).To(BeEmpty())
	g.Expect(client.cert.NotAfter).To(Equal(ca.cert.NotAfter), "never beyond the CA")

	_, err = verifyProvided(data, now)
	g.Expect(err).NotTo(HaveOccurred())
	_, err = verifyProvided(map[string][]byte{keyCert: leaf.certPEM, keyKey: leaf.keyPEM, keyCA: other.certPEM}, now)
	g.Expect(err).To(MatchError(ContainSubstring("not valid under ca.crt")))
	_, err = verifyProvided(map[string][]byte{keyCert: leaf.certPEM, keyKey: leaf.keyPEM}, now)
	g.Expect(err).To(MatchError("it has no ca.crt"))
}

// TestMemberSettingsRunEtcdTLS runs the etcd binary with exactly the
// settings a member pod with client and peer TLS gets, with certificates the
// operator issues in the files its Secret volumes hold: the operator's
// client reaches it by an IP its certificate does not name; a client without a certificate is refused; the
// readiness probe's /health answers on the plain metrics port, before and
// after the operator turns authentication on.
//
// Not parallel: its writes to etcd are tried once, within 5 s, and one
// missed that at a load average of 25 while the tests that run in parallel
// ran beside it.
func TestMemberSettingsRunEtcdTLS(t *testing.T) {
	g := NewWithT(t)
	assets, err := testenv.AssetsDir()
	g.Expect(err).NotTo(HaveOccurred())
	clientPort, peerPort, metricsPort := freePort(t), freePort(t), freePort(t)
	c := tlsCluster()
	c.Spec.Network.ClientPort, c.Spec.Network.PeerPort = clientPort, peerPort
	c.Spec.Advanced.DataDir = t.TempDir()
	c.Spec.Security.Auth = &etcdv1alpha1.EtcdAuthSpec{Enabled: true}
	s := spec(c)

	now := time.Now()
	ca, err := newCA(c, now, 10*time.Hour)
	g.Expect(err).NotTo(HaveOccurred())
	dir := t.TempDir()
	secrets := map[string]map[string][]byte{}
	for _, role := range []certRole{roleServer, rolePeer, roleClient} {
		pair, err := issue(c, role, ca, now, time.Hour)
		g.Expect(err).NotTo(HaveOccurred())
		data := map[string][]byte{keyCert: pair.certPEM, keyKey: pair.keyPEM, keyCA: ca.certPEM}
		secrets[role.name] = data
		g.Expect(os.MkdirAll(filepath.Join(dir, role.name), 0o700)).To(Succeed())
		for k, v := range data {
			g.Expect(os.WriteFile(filepath.Join(dir, role.name, k), v, 0o600)).To(Succeed())
		}
	}
	cm := buildConfigMap(c, s)
	sts := buildStatefulSet(c, s, hashData(cm.Data), 1)
	container := sts.Spec.Template.Spec.Containers[0]
	g.Expect(container.ReadinessProbe.HTTPGet.Port.StrVal).To(Equal(metricsPortName))
	g.Expect(container.ReadinessProbe.HTTPGet.Scheme).To(Equal(corev1.URISchemeHTTP))
	g.Expect(sts.Spec.Template.Spec.Volumes).To(ContainElements(
		HaveField("VolumeSource.Secret.SecretName", "solo-server-tls"),
		HaveField("VolumeSource.Secret.SecretName", "solo-peer-tls"),
	))
	// The container's paths, where this test keeps the files, and a free
	// metrics port.
	local := strings.NewReplacer(tlsServerDir, filepath.Join(dir, "server"), tlsPeerDir, filepath.Join(dir, "peer"),
		fmt.Sprintf(":%d", etcdv1alpha1.MetricsPort), fmt.Sprintf(":%d", metricsPort))
	env := []string{}
	for k, v := range cm.Data {
		env = append(env, k+"="+local.Replace(v))
	}
	name := memberName(c, 0)
	// What the Downward API gives the member: its name, and the bootstrap
	// the operator writes on a new cluster's pod.
	fields := map[string]string{
		"ETCD_NAME":                  name,
		"ETCD_INITIAL_CLUSTER":       name + "=" + peerURL(c, s, 0),
		"ETCD_INITIAL_CLUSTER_STATE": "new",
	}
	for _, e := range container.Env {
		v := e.Value
		if e.ValueFrom != nil {
			f, ok := fields[e.Name]
			g.Expect(ok).To(BeTrue(), "the test does not know what the pod gives %s", e.Name)
			v = f
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

	tlsCfg, err := clientTLSConfig(c, secrets[roleClient.name])
	g.Expect(err).NotTo(HaveOccurred())
	access := etcdAccess{TLS: tlsCfg, Username: rootUser, Password: "s3cret"}
	// The member listens on every address; the operator dials it by an
	// address its certificate does not name, as it dials pods by IP.
	endpoint := fmt.Sprintf("https://127.0.0.2:%d", clientPort)
	g.Expect(memberEndpoints(c, []corev1.Pod{{Status: corev1.PodStatus{PodIP: "127.0.0.2"}}})).To(Equal([]string{endpoint}))
	var v etcdView
	g.Eventually(func(g Gomega) {
		v = observeEtcd(t.Context(), access, []string{endpoint}, 2*time.Second)
		g.Expect(v.err).NotTo(HaveOccurred())
		g.Expect(v.healthyVoters()).To(Equal(int32(1)))
	}).WithTimeout(30 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
	g.Expect(v.members[0].peerURLs).To(Equal([]string{fmt.Sprintf("https://solo-0.solo-peer.db.svc:%d", peerPort)}))

	health := func() (int, error) {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/health", metricsPort))
		if err != nil {
			return 0, err
		}
		_ = resp.Body.Close()
		return resp.StatusCode, nil
	}
	g.Expect(health()).To(Equal(http.StatusOK))

	noCert := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: tlsCfg.RootCAs, ServerName: serverName(c), MinVersion: tls.VersionTLS12}}}
	resp, err := noCert.Get(endpoint + "/health")
	if err == nil {
		_ = resp.Body.Close()
	}
	g.Expect(err).To(HaveOccurred(), "a client without a certificate is refused")

	r := NewReconciler(nil, nil, nil, Options{})
	r.ensureAuth(context.Background(), c, access, []string{endpoint}, v)
	g.Expect(c.Status.Conditions).To(ContainElement(And(
		HaveField("Type", etcdv1alpha1.ConditionAuthEnabled), HaveField("Status", metav1.ConditionTrue))))
	r.ensureAuth(context.Background(), c, access, []string{endpoint}, v)
	g.Expect(c.Status.Conditions).To(ContainElement(And(
		HaveField("Type", etcdv1alpha1.ConditionAuthEnabled), HaveField("Status", metav1.ConditionTrue))), "again: auth is already on")
	g.Expect(health()).To(Equal(http.StatusOK), "the probe passes with auth on")
	put := func(a etcdAccess) error {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		cli, err := newEtcdClient(ctx, a, []string{endpoint}, 2*time.Second)
		if err != nil {
			return err
		}
		defer func() { _ = cli.Close() }()
		_, err = cli.Put(ctx, "/k", "v")
		return err
	}
	g.Expect(put(access)).To(Succeed(), "as root")
	g.Expect(put(etcdAccess{TLS: tlsCfg})).To(MatchError(ContainSubstring("permission denied")), "without the password")
}

// TestClientTLSConfigVerifiesByName: the operator's TLS configuration
// accepts a member's certificate whatever address it dialled, and refuses
// one of another cluster (same CA) or from another CA.
func TestClientTLSConfigVerifiesByName(t *testing.T) {
	g := NewWithT(t)
	c := tlsCluster()
	other := tlsCluster()
	other.Name = "other"
	now := time.Now()
	ca, err := newCA(c, now, 10*time.Hour)
	g.Expect(err).NotTo(HaveOccurred())
	foreign, err := newCA(c, now, 10*time.Hour)
	g.Expect(err).NotTo(HaveOccurred())
	client, err := issue(c, roleClient, ca, now, time.Hour)
	g.Expect(err).NotTo(HaveOccurred())
	cfg, err := clientTLSConfig(c, map[string][]byte{keyCert: client.certPEM, keyKey: client.keyPEM, keyCA: ca.certPEM})
	g.Expect(err).NotTo(HaveOccurred())
	state := func(cluster *etcdv1alpha1.EtcdCluster, by keyPair) tls.ConnectionState {
		server, err := issue(cluster, roleServer, by, now, time.Hour)
		g.Expect(err).NotTo(HaveOccurred())
		return tls.ConnectionState{PeerCertificates: []*x509.Certificate{server.cert}}
	}
	g.Expect(cfg.VerifyConnection(state(c, ca))).To(Succeed())
	g.Expect(cfg.VerifyConnection(state(other, ca))).To(MatchError(ContainSubstring("solo-client.db.svc")))
	g.Expect(cfg.VerifyConnection(state(c, foreign))).To(MatchError(ContainSubstring("unknown authority")))
	g.Expect(cfg.VerifyConnection(tls.ConnectionState{})).To(HaveOccurred())
}
