package controller

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"

	etcdv1alpha1 "github.com/sharder-dev/sharder/examples/etcd-operator/api/v1alpha1"
)

// Keys of the certificate Secrets, as cert-manager writes them.
const (
	keyCert = corev1.TLSCertKey       // tls.crt
	keyKey  = corev1.TLSPrivateKeyKey // tls.key
	keyCA   = "ca.crt"
)

// caValidityFactor: the CA the operator keeps for a cluster lives this many
// times as long as the certificates it issues. It is never renewed: members
// load the CA they trust when they start.
const caValidityFactor = 10

// backdate is how far before its issue a certificate becomes valid, so that
// a member whose clock is slightly behind accepts it.
const backdate = time.Minute

// certRole is one kind of certificate the operator issues for a cluster.
type certRole struct {
	// name of the role in Secret names, events and messages.
	name string
	// usages of the key.
	usages []x509.ExtKeyUsage
	// dnsNames and ips the certificate names; none for client
	// certificates: etcd checks the names of a client certificate that has
	// any against the address it connects from, which a pod's certificate
	// cannot know.
	dnsNames func(c *etcdv1alpha1.EtcdCluster) []string
	ips      []net.IP
}

var (
	// roleServer serves clients and peers: every member's name through the
	// peer Service, the client Service, and the member itself locally.
	roleServer = certRole{
		name:   "server",
		usages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		dnsNames: func(c *etcdv1alpha1.EtcdCluster) []string {
			peer, client, ns := peerServiceName(c), clientServiceName(c), c.Namespace
			return []string{
				"*." + peer + "." + ns + ".svc", "*." + peer + "." + ns + ".svc.cluster.local",
				client, client + "." + ns, serverName(c), client + "." + ns + ".svc.cluster.local",
				"localhost",
			}
		},
		ips: []net.IP{net.ParseIP("127.0.0.1"), net.IPv6loopback},
	}
	// rolePeer is what members present to each other.
	rolePeer = certRole{name: "peer", usages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	// roleClient is what the operator presents (and users may borrow).
	roleClient = certRole{name: "client", usages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
)

// serverName is the name the operator verifies members' certificates by: it
// dials them by pod IP, which no certificate names.
func serverName(c *etcdv1alpha1.EtcdCluster) string {
	return clientServiceName(c) + "." + c.Namespace + ".svc"
}

// commonName of a role's certificate. With authentication on, etcd takes the
// common name of a client certificate as the user of a request that carries
// no token: none of these names a user the operator creates.
func (role certRole) commonName(c *etcdv1alpha1.EtcdCluster) string {
	return c.Name + "-" + role.name
}

// keyPair is a parsed certificate with its key and their PEM encoding.
type keyPair struct {
	cert    *x509.Certificate
	key     crypto.Signer
	certPEM []byte
	keyPEM  []byte
}

// parseKeyPair parses a PEM certificate and its key and checks they match.
func parseKeyPair(certPEM, keyPEM []byte) (keyPair, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return keyPair{}, err
	}
	signer, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return keyPair{}, errors.New("the private key cannot sign")
	}
	return keyPair{cert: pair.Leaf, key: signer, certPEM: certPEM, keyPEM: keyPEM}, nil
}

// newCA creates a self-signed CA for c, valid for validity from now.
func newCA(c *etcdv1alpha1.EtcdCluster, now time.Time, validity time.Duration) (keyPair, error) {
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: c.Namespace + "/" + c.Name + " etcd CA"},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	return sign(tmpl, nil)
}

// issue creates a certificate of role for c signed by ca, valid for validity
// from now (never beyond the CA).
func issue(c *etcdv1alpha1.EtcdCluster, role certRole, ca keyPair, now time.Time, validity time.Duration) (keyPair, error) {
	notAfter := now.Add(validity)
	if notAfter.After(ca.cert.NotAfter) {
		notAfter = ca.cert.NotAfter
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: role.commonName(c)},
		NotBefore:   now.Add(-backdate),
		NotAfter:    notAfter,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: role.usages,
		IPAddresses: role.ips,
	}
	if role.dnsNames != nil {
		tmpl.DNSNames = role.dnsNames(c)
	}
	return sign(tmpl, &ca)
}

// sign creates a key and a certificate of it from tmpl, signed by parent
// (self-signed when nil).
func sign(tmpl *x509.Certificate, parent *keyPair) (keyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return keyPair{}, fmt.Errorf("generating a key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return keyPair{}, fmt.Errorf("generating a serial number: %w", err)
	}
	tmpl.SerialNumber = serial
	issuer, signer := tmpl, crypto.Signer(key)
	if parent != nil {
		issuer, signer = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, issuer, key.Public(), signer)
	if err != nil {
		return keyPair{}, fmt.Errorf("signing %q: %w", tmpl.Subject.CommonName, err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return keyPair{}, fmt.Errorf("encoding a key: %w", err)
	}
	return parseKeyPair(
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	)
}

// reissueReason says why the certificate of role in data (a Secret's data)
// must be issued again for c by ca at now, or "" if it is fine as it is:
// it is missing or unreadable, not signed by ca, names other hosts than the
// role needs, or expires within renewBefore.
func reissueReason(c *etcdv1alpha1.EtcdCluster, role certRole, ca keyPair, data map[string][]byte, now time.Time, renewBefore time.Duration) string {
	if len(data[keyCert]) == 0 || len(data[keyKey]) == 0 {
		return "no certificate yet"
	}
	pair, err := parseKeyPair(data[keyCert], data[keyKey])
	if err != nil {
		return "the certificate is unreadable: " + err.Error()
	}
	if !bytes.Equal(data[keyCA], ca.certPEM) {
		return "its CA changed"
	}
	if err := pair.cert.CheckSignatureFrom(ca.cert); err != nil {
		return "the CA did not sign it"
	}
	var want []string
	if role.dnsNames != nil {
		want = role.dnsNames(c)
	}
	if !slices.Equal(pair.cert.DNSNames, want) {
		return "it names other hosts"
	}
	if !now.Before(pair.cert.NotAfter.Add(-renewBefore)) {
		return fmt.Sprintf("it expires at %s", pair.cert.NotAfter.UTC().Format(time.RFC3339))
	}
	return ""
}

// verifyProvided checks a user's certificate Secret: tls.crt, tls.key and
// ca.crt present, the pair matching, the CA having signed it, and valid at
// now. It returns the certificate.
func verifyProvided(data map[string][]byte, now time.Time) (*x509.Certificate, error) {
	for _, k := range []string{keyCert, keyKey, keyCA} {
		if len(data[k]) == 0 {
			return nil, fmt.Errorf("it has no %s", k)
		}
	}
	pair, err := parseKeyPair(data[keyCert], data[keyKey])
	if err != nil {
		return nil, fmt.Errorf("tls.crt and tls.key: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data[keyCA]) {
		return nil, errors.New("ca.crt holds no certificate")
	}
	if _, err := pair.cert.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return nil, fmt.Errorf("tls.crt is not valid under ca.crt: %w", err)
	}
	return pair.cert, nil
}

// clientTLSConfig is the TLS configuration of a client of c presenting the
// certificate in data (a certificate Secret's data) and trusting its ca.crt.
func clientTLSConfig(c *etcdv1alpha1.EtcdCluster, data map[string][]byte) (*tls.Config, error) {
	pair, err := tls.X509KeyPair(data[keyCert], data[keyKey])
	if err != nil {
		return nil, fmt.Errorf("client certificate: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data[keyCA]) {
		return nil, errors.New("client certificate Secret: ca.crt holds no certificate")
	}
	name := serverName(c)
	return &tls.Config{
		Certificates: []tls.Certificate{pair},
		RootCAs:      pool,
		ServerName:   name,
		MinVersion:   tls.VersionTLS12,
		// The operator dials members by pod IP, and gRPC verifies a server
		// by the address it dials, whatever ServerName says: the standard
		// check is off and VerifyConnection does it by name instead.
		InsecureSkipVerify: true, //nolint:gosec // verified in VerifyConnection
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verifyServer(cs, pool, name)
		},
	}, nil
}

// verifyServer verifies a server's certificate chain against roots and its
// name against name, as crypto/tls would for a server dialled by that name.
func verifyServer(cs tls.ConnectionState, roots *x509.CertPool, name string) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("the server presented no certificate")
	}
	opts := x509.VerifyOptions{Roots: roots, DNSName: name, Intermediates: x509.NewCertPool()}
	for _, cert := range cs.PeerCertificates[1:] {
		opts.Intermediates.AddCert(cert)
	}
	if _, err := cs.PeerCertificates[0].Verify(opts); err != nil {
		return fmt.Errorf("verifying the server as %s: %w", name, err)
	}
	return nil
}
