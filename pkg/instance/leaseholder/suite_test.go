package leaseholder_test

import (
	"context"
	"os"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/sharder-dev/sharder/internal/fixture"
	"github.com/sharder-dev/sharder/internal/testenv"
)

// sharderIdentity is the holder the tests write when they take a Lease as the
// sharder would.
const sharderIdentity = "sharder:test"

var suite testenv.Suite // the control plane, started for the first test that calls env

func env() *testenv.Env { return suite.Env() }

func TestMain(m *testing.M) {
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr)))
	// Lease timings in these tests are 1-2 s; a loaded machine adds latency.
	SetDefaultEventuallyTimeout(10 * time.Second)
	SetDefaultEventuallyPollingInterval(20 * time.Millisecond)
	os.Exit(testenv.Run(m, &suite, testenv.Options{}))
}

// createLease creates an instance Lease as an instance would, renewed at
// renew (the instance then stops renewing, as if it crashed).
func createLease(t *testing.T, ring, namespace, id string, renew time.Time, seconds int32, mutate ...func(*coordinationv1.Lease)) *coordinationv1.Lease {
	t.Helper()
	lease := fixture.InstanceLease(ring, namespace, id, renew, time.Duration(seconds)*time.Second, mutate...)
	NewWithT(t).Expect(env().Client.Create(context.Background(), lease)).To(Succeed())
	return lease
}

// getLease reads a Lease from the API server.
func getLease(namespace, name string) func() (*coordinationv1.Lease, error) {
	return fixture.GetLease(env().Client, namespace, name)
}
