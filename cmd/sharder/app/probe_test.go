package app

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

// caFile writes the certificate of a test server into a PEM file: it is
// its own CA.
func caFile(t *testing.T, srv *httptest.Server) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ca.crt")
	data := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// otherCA writes a CA certificate of its own into a PEM file: it signed
// nothing any test server holds.
func otherCA(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "other CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "other-ca.crt")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func runProbe(args ...string) (string, error) {
	cmd := NewRootCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(append([]string{"probe", "--interval=50ms"}, args...))
	err := cmd.Execute()
	return out.String(), err
}

func TestProbe(t *testing.T) {
	notFound := httptest.NewTLSServer(http.NotFoundHandler())
	defer notFound.Close()
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer plain.Close()
	// An address nothing listens on.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "https://" + ln.Addr().String() + "/"
	_ = ln.Close()

	t.Run("any answer over verified TLS", func(t *testing.T) {
		g := NewWithT(t)
		out, err := runProbe("--ca-file", caFile(t, notFound), notFound.URL+"/")
		g.Expect(err).NotTo(HaveOccurred(), out)
		g.Expect(out).To(ContainSubstring("answered: 404 Not Found"))
	})
	t.Run("plain HTTP, an error status", func(t *testing.T) {
		g := NewWithT(t)
		out, err := runProbe(plain.URL)
		g.Expect(err).NotTo(HaveOccurred(), out)
		g.Expect(out).To(ContainSubstring("503"))
	})
	t.Run("a certificate of another CA", func(t *testing.T) {
		g := NewWithT(t)
		out, err := runProbe("--timeout=300ms", "--ca-file", otherCA(t), notFound.URL+"/")
		g.Expect(err).To(MatchError(ContainSubstring("no answer from " + notFound.URL + "/ within 300ms")))
		g.Expect(err).To(MatchError(ContainSubstring("certificate")))
		g.Expect(out).NotTo(ContainSubstring("answered"))
	})
	t.Run("a certificate for another name", func(t *testing.T) {
		g := NewWithT(t)
		_, err := runProbe("--timeout=300ms", "--ca-file", caFile(t, notFound), "--server-name", "sharder-webhook.sharder-system.svc", notFound.URL+"/")
		g.Expect(err).To(MatchError(ContainSubstring("sharder-webhook.sharder-system.svc")))
	})
	t.Run("nothing listening", func(t *testing.T) {
		g := NewWithT(t)
		_, err := runProbe("--timeout=300ms", closed)
		g.Expect(err).To(MatchError(ContainSubstring("connection refused")))
	})
	t.Run("flags checked before trying", func(t *testing.T) {
		g := NewWithT(t)
		_, err := runProbe("ftp://example.com/")
		g.Expect(err).To(MatchError(ContainSubstring("must be http(s)://")))
		_, err = runProbe("--ca-file", "ca.crt", plain.URL)
		g.Expect(err).To(MatchError(ContainSubstring("need an https URL")))
		_, err = runProbe("--ca-file", filepath.Join(t.TempDir(), "missing.crt"), notFound.URL)
		g.Expect(err).To(MatchError(ContainSubstring("--ca-file")))
	})
}
