package pki

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"maps"
	"testing"
	"time"
)

var testConfig = Config{
	Hosts:           []string{"sharder-webhook.sharder-system.svc", "127.0.0.1"},
	CAValidity:      365 * 24 * time.Hour,
	CARenewBefore:   120 * 24 * time.Hour,
	CertValidity:    90 * 24 * time.Hour,
	CertRenewBefore: 30 * 24 * time.Hour,
	CAPropagation:   10 * time.Minute,
}

var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// verify checks that the stored serving certificate is valid at now for
// every host, against the stored CA bundle only, and returns it.
func verify(t *testing.T, data map[string][]byte, now time.Time) *x509.Certificate {
	t.Helper()
	pair, err := tls.X509KeyPair(data[KeyCert], data[KeyKey])
	if err != nil {
		t.Fatalf("serving key pair: %v", err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data[KeyCABundle]) {
		t.Fatal("CA bundle holds no certificate")
	}
	for _, h := range testConfig.Hosts {
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: h, Roots: pool, CurrentTime: now}); err != nil {
			t.Fatalf("at %s the serving certificate does not verify for %s: %v", now, h, err)
		}
	}
	return leaf
}

func mustReconcile(t *testing.T, data map[string][]byte, cfg Config, now time.Time) Result {
	t.Helper()
	res, err := Reconcile(data, cfg, now)
	if err != nil {
		t.Fatalf("Reconcile at %s: %v", now, err)
	}
	return res
}

func TestReconcileCreatesAndKeeps(t *testing.T) {
	res := mustReconcile(t, nil, testConfig, t0)
	if !res.Changed {
		t.Fatal("empty material: want Changed")
	}
	verify(t, res.Data, t0)
	if n := len(ParseBundle(res.Data[KeyCABundle])); n != 1 {
		t.Fatalf("bundle holds %d CAs, want 1", n)
	}
	wantNext := t0.Add(testConfig.CertValidity - testConfig.CertRenewBefore)
	if !res.Next.Equal(wantNext) {
		t.Fatalf("Next = %s, want the serving certificate's renewal %s", res.Next, wantNext)
	}

	again := mustReconcile(t, res.Data, testConfig, t0.Add(time.Hour))
	if again.Changed || !maps.EqualFunc(again.Data, res.Data, bytes.Equal) {
		t.Fatalf("valid material changed: %v", again.Reasons)
	}
}

func TestReconcileRenewsServingCertificate(t *testing.T) {
	first := mustReconcile(t, nil, testConfig, t0)
	at := first.Next
	res := mustReconcile(t, first.Data, testConfig, at)
	if !res.Changed {
		t.Fatal("serving certificate at its renewal time: want reissued")
	}
	if !bytes.Equal(res.Data[KeyCABundle], first.Data[KeyCABundle]) || !bytes.Equal(res.Data[KeyCAKey], first.Data[KeyCAKey]) {
		t.Fatal("renewing the serving certificate changed the CA")
	}
	if bytes.Equal(res.Data[KeyCert], first.Data[KeyCert]) {
		t.Fatal("serving certificate not reissued")
	}
	if leaf := verify(t, res.Data, at); !leaf.NotAfter.Equal(at.Add(testConfig.CertValidity)) {
		t.Fatalf("NotAfter = %s, want %s", leaf.NotAfter, at.Add(testConfig.CertValidity))
	}
}

func TestReconcileReissuesForNewHosts(t *testing.T) {
	first := mustReconcile(t, nil, testConfig, t0)
	cfg := testConfig
	cfg.Hosts = []string{"other.sharder-system.svc"}
	res := mustReconcile(t, first.Data, cfg, t0.Add(time.Minute))
	if !res.Changed || bytes.Equal(res.Data[KeyCert], first.Data[KeyCert]) {
		t.Fatal("hosts changed: want a new serving certificate")
	}
	leaf, err := tls.X509KeyPair(res.Data[KeyCert], res.Data[KeyKey])
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(leaf.Certificate[0])
	if len(c.DNSNames) != 1 || c.DNSNames[0] != "other.sharder-system.svc" || len(c.IPAddresses) != 0 {
		t.Fatalf("names = %v %v", c.DNSNames, c.IPAddresses)
	}
}

func TestReconcileRecoversFromGarbage(t *testing.T) {
	for name, data := range map[string]map[string][]byte{
		"garbage everywhere": {KeyCABundle: []byte("x"), KeyCAKey: []byte("y"), KeyCert: []byte("z"), KeyKey: []byte("w")},
		"key without CA":     {KeyCAKey: mustReconcile(t, nil, testConfig, t0).Data[KeyCAKey]},
		"CA of another key": func() map[string][]byte {
			a, b := mustReconcile(t, nil, testConfig, t0).Data, mustReconcile(t, nil, testConfig, t0).Data
			a[KeyCAKey] = b[KeyCAKey]
			return a
		}(),
	} {
		t.Run(name, func(t *testing.T) {
			res := mustReconcile(t, data, testConfig, t0)
			if !res.Changed {
				t.Fatal("unusable material: want new material")
			}
			verify(t, res.Data, t0)
		})
	}
}

// TestReconcileRotationOverYears follows the material through several CA
// lifetimes, reconciling exactly when asked (Result.Next), and checks at
// every step and just before the next that the served certificate verifies
// against the stored bundle and that a certificate signed by a new CA is
// only served after the CA has been in the bundle for CAPropagation.
func TestReconcileRotationOverYears(t *testing.T) {
	res := mustReconcile(t, nil, testConfig, t0)
	data := res.Data
	trustedSince := map[string]time.Time{} // CA subject -> when it entered the bundle
	for _, ca := range ParseBundle(data[KeyCABundle]) {
		trustedSince[ca.Subject.CommonName] = t0
	}
	now, end := t0, t0.Add(4*testConfig.CAValidity)
	caRotations, steps := 0, 0
	for now.Before(end) {
		steps++
		if steps > 1000 {
			t.Fatal("too many steps: Next does not advance")
		}
		if !res.Next.After(now) {
			t.Fatalf("Next %s is not after now %s", res.Next, now)
		}
		verify(t, data, res.Next.Add(-time.Second))
		now = res.Next
		res = mustReconcile(t, data, testConfig, now)
		data = res.Data
		leaf := verify(t, data, now)
		bundle := ParseBundle(data[KeyCABundle])
		for _, ca := range bundle {
			if _, ok := trustedSince[ca.Subject.CommonName]; !ok {
				trustedSince[ca.Subject.CommonName] = now
				caRotations++
			}
			if !now.Before(ca.NotAfter) {
				t.Fatalf("expired CA %s kept in the bundle at %s", ca.Subject.CommonName, now)
			}
		}
		if len(bundle) > 2 {
			t.Fatalf("bundle holds %d CAs", len(bundle))
		}
		for _, ca := range bundle {
			if leaf.CheckSignatureFrom(ca) == nil {
				since := trustedSince[ca.Subject.CommonName]
				if !since.Equal(t0) && now.Sub(since) < testConfig.CAPropagation {
					t.Fatalf("at %s serving a certificate of a CA trusted only since %s", now, since)
				}
			}
		}
	}
	if caRotations < 3 {
		t.Fatalf("%d CA rotations over four CA lifetimes, want at least 3", caRotations)
	}
}

func TestConfigValidate(t *testing.T) {
	for name, mutate := range map[string]func(*Config){
		"no hosts":                      func(c *Config) { c.Hosts = nil },
		"CA renewal beyond validity":    func(c *Config) { c.CARenewBefore = c.CAValidity },
		"cert renewal beyond validity":  func(c *Config) { c.CertRenewBefore = c.CertValidity },
		"cert outlives CA renewal":      func(c *Config) { c.CARenewBefore = c.CertValidity },
		"zero cert validity":            func(c *Config) { c.CertValidity = 0 },
		"negative propagation":          func(c *Config) { c.CAPropagation = -time.Second },
		"propagation eats CA lead time": func(c *Config) { c.CAPropagation = c.CARenewBefore },
	} {
		t.Run(name, func(t *testing.T) {
			cfg := testConfig
			mutate(&cfg)
			if err := cfg.Validate(); err == nil {
				t.Fatal("want an error")
			}
			if _, err := Reconcile(nil, cfg, t0); err == nil {
				t.Fatal("Reconcile accepted an invalid config")
			}
		})
	}
	if err := testConfig.Validate(); err != nil {
		t.Fatal(err)
	}
}
