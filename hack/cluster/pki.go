package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// pki is the cluster's certificate authority. Every certificate is issued
// fresh by each up; nothing outlives the cluster.
type pki struct {
	l      layout
	cert   *x509.Certificate
	key    crypto.Signer
	certPE []byte
}

func newKey() (crypto.Signer, error) {
	return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	return n
}

func newPKI(l layout) (*pki, error) {
	if err := os.MkdirAll(l.path("pki"), 0o700); err != nil {
		return nil, err
	}
	key, err := newKey()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "sharder-cluster-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	p := &pki{l: l, cert: cert, key: key, certPE: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
	return p, p.write("ca", p.certPE, key)
}

// issue writes NAME.crt and NAME.key, a certificate for a client (no hosts)
// or a server (hosts are DNS names or IPs).
func (p *pki) issue(name, cn string, orgs []string, hosts ...string) error {
	key, err := newKey()
	if err != nil {
		return err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if len(hosts) > 0 {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.cert, key.Public(), p.key)
	if err != nil {
		return fmt.Errorf("issuing %s: %w", name, err)
	}
	return p.write(name, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), key)
}

// keyPair writes NAME.key and NAME.pub (the ServiceAccount token keys).
func (p *pki) keyPair(name string) error {
	key, err := newKey()
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return err
	}
	if err := os.WriteFile(p.l.pki(name+".pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o600); err != nil {
		return err
	}
	return writeKey(p.l.pki(name+".key"), key)
}

func (p *pki) write(name string, certPEM []byte, key crypto.Signer) error {
	if err := os.WriteFile(p.l.pki(name+".crt"), certPEM, 0o600); err != nil {
		return err
	}
	return writeKey(p.l.pki(name+".key"), key)
}

func writeKey(path string, key crypto.Signer) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600)
}

// kubeconfig writes a kubeconfig for the client certificate NAME to path.
func (p *pki) kubeconfig(path, name, server string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["sharder-cluster"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: p.certPE}
	cert, err := os.ReadFile(p.l.pki(name + ".crt"))
	if err != nil {
		return err
	}
	key, err := os.ReadFile(p.l.pki(name + ".key"))
	if err != nil {
		return err
	}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{ClientCertificateData: cert, ClientKeyData: key}
	cfg.Contexts["sharder-cluster"] = &clientcmdapi.Context{Cluster: "sharder-cluster", AuthInfo: name}
	cfg.CurrentContext = "sharder-cluster"
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return err
	}
	return clientcmd.WriteToFile(*cfg, path)
}
