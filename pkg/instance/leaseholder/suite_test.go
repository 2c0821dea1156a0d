package leaseholder_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/sharder-dev/sharder/internal/testenv"
	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// sharderIdentity is the holder the tests write when they take a Lease as the
// sharder would.
const sharderIdentity = "sharder:test"

var env *testenv.Env

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr)))
	// Lease timings in these tests are 1-2 s; a loaded machine adds latency.
	SetDefaultEventuallyTimeout(10 * time.Second)
	SetDefaultEventuallyPollingInterval(20 * time.Millisecond)
	var err error
	env, err = testenv.Start(testenv.Options{})
	if err != nil {
		fmt.Fprintf(os.Stderr, "starting the control plane: %v\n", err)
		return 1
	}
	defer func() { _ = env.Stop() }()
	return m.Run()
}

// createLease creates an instance Lease as an instance would, renewed at
// renew (the instance then stops renewing, as if it crashed).
func createLease(t *testing.T, ring, namespace, id string, renew time.Time, seconds int32, mutate ...func(*coordinationv1.Lease)) *coordinationv1.Lease {
	t.Helper()
	l := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: id, Namespace: namespace, Labels: map[string]string{v1alpha1.LabelRing: ring}},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       ptr.To(id),
			AcquireTime:          ptr.To(metav1.NewMicroTime(renew)),
			RenewTime:            ptr.To(metav1.NewMicroTime(renew)),
			LeaseDurationSeconds: ptr.To(seconds),
		},
	}
	for _, m := range mutate {
		m(l)
	}
	NewWithT(t).Expect(env.Client.Create(context.Background(), l)).To(Succeed())
	return l
}

// getLease reads a Lease from the API server.
func getLease(namespace, name string) func() (*coordinationv1.Lease, error) {
	return func() (*coordinationv1.Lease, error) {
		l := &coordinationv1.Lease{}
		err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: namespace, Name: name}, l)
		return l, err
	}
}
