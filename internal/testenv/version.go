package testenv

import (
	"strconv"
	"strings"
	"testing"

	"k8s.io/client-go/discovery"
)

// ServerMinor returns the minor version the API server reports (/version):
// 30 for v1.30.14. `make test` runs against the newest release the Makefile
// pins, `make test-compat` against the oldest one the sharder supports.
func (e *Env) ServerMinor(t testing.TB) int {
	t.Helper()
	dc, err := discovery.NewDiscoveryClientForConfig(e.Config)
	if err != nil {
		t.Fatalf("creating discovery client: %v", err)
	}
	v, err := dc.ServerVersion()
	if err != nil {
		t.Fatalf("reading the API server's version: %v", err)
	}
	minor, err := strconv.Atoi(strings.TrimSuffix(v.Minor, "+"))
	if err != nil {
		t.Fatalf("the API server reports minor version %q: %v", v.Minor, err)
	}
	return minor
}

// SkipBefore skips the test when the API server is older than 1.<minor>:
// for a test whose subject is what feature, which that release brought. The
// reason names both, so a skipped test says what it did not check and where.
func (e *Env) SkipBefore(t testing.TB, minor int, feature string) {
	t.Helper()
	if got := e.ServerMinor(t); got < minor {
		t.Skipf("%s needs Kubernetes 1.%d or later; this API server is 1.%d", feature, minor, got)
	}
}
