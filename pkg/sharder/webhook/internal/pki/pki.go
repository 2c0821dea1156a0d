// Package pki keeps the webhook's certificate authority and serving
// certificate: it decides, from the current key material and the time, what
// must be created or rotated, and produces the new material. It does no I/O;
// the caller stores the result (a Secret) and serves it.
package pki

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
)

// Keys of the stored material (the data keys of the Secret).
const (
	// KeyCABundle holds every CA certificate clients must trust, newest first.
	KeyCABundle = "ca.crt"
	// KeyCAKey holds the private key of the newest CA (the signer).
	KeyCAKey = "ca.key"
	// KeyCert holds the serving certificate.
	KeyCert = "tls.crt"
	// KeyKey holds the serving certificate's private key.
	KeyKey = "tls.key"
)

// Backdate is subtracted from NotBefore of every certificate so that clocks
// a little behind the sharder's accept it at once.
const Backdate = 5 * time.Minute

// Config says what to issue and when to rotate. Zero durations are invalid;
// the caller fills defaults.
type Config struct {
	// Hosts are the serving certificate's DNS names and IP addresses.
	Hosts []string
	// CAValidity is the lifetime of a CA.
	CAValidity time.Duration
	// CARenewBefore: a new CA is created when the signer has less than this
	// left. Must be longer than CertValidity, so that a serving certificate
	// never outlives the CA that signed it.
	CARenewBefore time.Duration
	// CertValidity is the lifetime of a serving certificate.
	CertValidity time.Duration
	// CertRenewBefore: the serving certificate is reissued when it has less
	// than this left.
	CertRenewBefore time.Duration
	// CAPropagation is how long a new CA is trusted (in the bundle) before
	// the serving certificate is reissued by it, so that the webhook
	// configuration carries the new CA before clients see a certificate
	// signed by it.
	CAPropagation time.Duration
}

// Validate reports inconsistent timings.
func (c Config) Validate() error {
	switch {
	case len(c.Hosts) == 0:
		return errors.New("no host name for the serving certificate")
	case c.CAValidity <= 0 || c.CertValidity <= 0 || c.CARenewBefore <= 0 || c.CertRenewBefore <= 0 || c.CAPropagation < 0:
		return errors.New("validities and renewal periods must be positive")
	case c.CARenewBefore >= c.CAValidity:
		return fmt.Errorf("CA renewal (%s before expiry) must be shorter than the CA validity (%s)", c.CARenewBefore, c.CAValidity)
	case c.CertRenewBefore >= c.CertValidity:
		return fmt.Errorf("certificate renewal (%s before expiry) must be shorter than its validity (%s)", c.CertRenewBefore, c.CertValidity)
	case c.CARenewBefore <= c.CertValidity+c.CAPropagation:
		return fmt.Errorf("CA renewal (%s before expiry) must exceed the certificate validity plus CA propagation (%s)", c.CARenewBefore, c.CertValidity+c.CAPropagation)
	}
	return nil
}

// Result is the outcome of Reconcile.
type Result struct {
	// Data is the material to store: the input unchanged, or new.
	Data map[string][]byte
	// Changed reports whether Data differs from the input.
	Changed bool
	// Reasons says what was done, for logs and events.
	Reasons []string
	// Next is when Reconcile has something to do again (a renewal, a
	// propagated CA, an expired CA to drop).
	Next time.Time
}

// Reconcile returns the material that should be stored at now: it creates
// everything missing or unreadable, creates a new CA before the signer
// expires (keeping older, unexpired CAs in the bundle), reissues the serving
// certificate when it nears expiry, names other hosts, or was signed by an
// older CA whose successor has propagated, and drops expired CAs. The same
// input and time always give the same decisions, so replicas that reconcile
// the same stored material concurrently agree on what to do.
func Reconcile(data map[string][]byte, cfg Config, now time.Time) (Result, error) {
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	r := reconciler{cfg: cfg, now: now}
	return r.run(data)
}

type reconciler struct {
	cfg     Config
	now     time.Time
	reasons []string
}

type authority struct {
	cert *x509.Certificate
	der  []byte
}

func (r *reconciler) run(data map[string][]byte) (Result, error) {
	bundle := parseCerts(data[KeyCABundle])
	caKey, keyErr := parseKey(data[KeyCAKey])
	signerIdx := -1
	if keyErr == nil {
		signerIdx = slices.IndexFunc(bundle, func(a authority) bool { return publicKeyMatches(a.cert, caKey) })
	}

	changed := false
	if signerIdx < 0 || !r.valid(bundle[signerIdx].cert) {
		// Nothing usable: start over with a new CA.
		a, key, err := r.newCA()
		if err != nil {
			return Result{}, err
		}
		r.reasons = append(r.reasons, "created a certificate authority")
		bundle, caKey, signerIdx, changed = []authority{a}, key, 0, true
	}
	signer := bundle[signerIdx]

	// Keep only unexpired CAs, the signer first.
	trusted := []authority{signer}
	for i, a := range bundle {
		if i == signerIdx {
			continue
		}
		if !r.now.Before(a.cert.NotAfter) {
			r.reasons = append(r.reasons, "dropped an expired certificate authority")
			changed = true
			continue
		}
		trusted = append(trusted, a)
	}
	if signerIdx != 0 {
		changed = true
	}

	if !r.now.Before(signer.cert.NotAfter.Add(-r.cfg.CARenewBefore)) {
		a, key, err := r.newCA()
		if err != nil {
			return Result{}, err
		}
		r.reasons = append(r.reasons, "rotated the certificate authority")
		trusted = append([]authority{a}, trusted...)
		signer, caKey, changed = a, key, true
	}

	certPEM, keyPEM := data[KeyCert], data[KeyKey]
	serving, issuer, why := r.checkServing(certPEM, keyPEM, trusted, signer)
	if why != "" {
		var err error
		certPEM, keyPEM, err = r.issue(signer, caKey)
		if err != nil {
			return Result{}, err
		}
		block, _ := pem.Decode(certPEM)
		if serving, err = x509.ParseCertificate(block.Bytes); err != nil {
			return Result{}, fmt.Errorf("parsing the new serving certificate: %w", err)
		}
		issuer = signer
		r.reasons = append(r.reasons, "issued a serving certificate: "+why)
		changed = true
	}

	out := data
	if changed {
		keyDER, err := x509.MarshalPKCS8PrivateKey(caKey)
		if err != nil {
			return Result{}, fmt.Errorf("encoding the CA key: %w", err)
		}
		var caPEM bytes.Buffer
		for _, a := range trusted {
			_ = pem.Encode(&caPEM, &pem.Block{Type: "CERTIFICATE", Bytes: a.der})
		}
		out = map[string][]byte{
			KeyCABundle: caPEM.Bytes(),
			KeyCAKey:    pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
			KeyCert:     certPEM,
			KeyKey:      keyPEM,
		}
	}

	next := signer.cert.NotAfter.Add(-r.cfg.CARenewBefore)
	next = earliest(next, serving.NotAfter.Add(-r.cfg.CertRenewBefore))
	if issuer.cert != signer.cert {
		next = earliest(next, r.propagated(signer.cert))
	}
	for _, a := range trusted[1:] {
		next = earliest(next, a.cert.NotAfter)
	}
	return Result{Data: out, Changed: changed, Reasons: r.reasons, Next: next}, nil
}

// checkServing returns the serving certificate, the CA that signed it, and
// why it must be reissued ("" when it may stay).
func (r *reconciler) checkServing(certPEM, keyPEM []byte, trusted []authority, signer authority) (*x509.Certificate, authority, string) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, authority{}, "none readable"
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, authority{}, "none readable"
	}
	if !r.now.Before(cert.NotAfter.Add(-r.cfg.CertRenewBefore)) {
		return nil, authority{}, "the current one expires soon"
	}
	if !r.valid(cert) {
		return nil, authority{}, "the current one is not valid now"
	}
	if !sameHosts(cert, r.cfg.Hosts) {
		return nil, authority{}, "the host names changed"
	}
	idx := slices.IndexFunc(trusted, func(a authority) bool { return cert.CheckSignatureFrom(a.cert) == nil })
	if idx < 0 {
		return nil, authority{}, "the current one is signed by an untrusted authority"
	}
	if trusted[idx].cert != signer.cert && !r.now.Before(r.propagated(signer.cert)) {
		return nil, authority{}, "the new certificate authority has propagated"
	}
	return cert, trusted[idx], ""
}

func (r *reconciler) valid(c *x509.Certificate) bool {
	return !r.now.Before(c.NotBefore) && r.now.Before(c.NotAfter)
}

// propagated is when a CA has been trusted long enough to sign with.
func (r *reconciler) propagated(ca *x509.Certificate) time.Time {
	return ca.NotBefore.Add(Backdate + r.cfg.CAPropagation)
}

func (r *reconciler) newCA() (authority, crypto.Signer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return authority{}, nil, fmt.Errorf("generating a CA key: %w", err)
	}
	sn, err := serial()
	if err != nil {
		return authority{}, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: "sharder-webhook-ca@" + r.now.UTC().Format(time.RFC3339)},
		NotBefore:             r.now.Add(-Backdate),
		NotAfter:              r.now.Add(r.cfg.CAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return authority{}, nil, fmt.Errorf("creating the CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return authority{}, nil, fmt.Errorf("parsing the new CA certificate: %w", err)
	}
	return authority{cert: cert, der: der}, key, nil
}

func (r *reconciler) issue(ca authority, caKey crypto.Signer) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generating a serving key: %w", err)
	}
	notAfter := r.now.Add(r.cfg.CertValidity)
	if notAfter.After(ca.cert.NotAfter) {
		notAfter = ca.cert.NotAfter
	}
	sn, err := serial()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: r.cfg.Hosts[0]},
		NotBefore:    r.now.Add(-Backdate),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range r.cfg.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("signing the serving certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("encoding the serving key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), nil
}

// ParseBundle returns the certificates of a PEM bundle, skipping anything
// unreadable.
func ParseBundle(pemBytes []byte) []*x509.Certificate {
	authorities := parseCerts(pemBytes)
	out := make([]*x509.Certificate, 0, len(authorities))
	for _, a := range authorities {
		out = append(out, a.cert)
	}
	return out
}

func parseCerts(pemBytes []byte) []authority {
	var out []authority
	for {
		var block *pem.Block
		block, pemBytes = pem.Decode(pemBytes)
		if block == nil {
			return out
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		if c, err := x509.ParseCertificate(block.Bytes); err == nil && c.IsCA {
			out = append(out, authority{cert: c, der: block.Bytes})
		}
	}
}

func parseKey(pemBytes []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(pemBytes)
	if block == nil {
		return nil, errors.New("no PEM block")
	}
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, err
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, errors.New("not a signing key")
	}
	return signer, nil
}

func publicKeyMatches(c *x509.Certificate, key crypto.Signer) bool {
	pub, ok := c.PublicKey.(interface{ Equal(crypto.PublicKey) bool })
	return ok && pub.Equal(key.Public())
}

func sameHosts(c *x509.Certificate, hosts []string) bool {
	have := slices.Clone(c.DNSNames)
	for _, ip := range c.IPAddresses {
		have = append(have, ip.String())
	}
	want := make([]string, 0, len(hosts))
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			h = ip.String()
		}
		want = append(want, h)
	}
	slices.Sort(have)
	slices.Sort(want)
	return slices.Equal(slices.Compact(have), slices.Compact(want))
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func serial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("reading a random serial number: %w", err)
	}
	return n, nil
}
