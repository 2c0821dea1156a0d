package testenv_test

import (
	"context"
	"os"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/sharder-dev/sharder/internal/testenv"
)

var suite testenv.Suite // the control plane, started for the first test that calls env

func env() *testenv.Env { return suite.Env() }

func TestMain(m *testing.M) { os.Exit(testenv.Run(m, &suite, testenv.Options{})) }

// TestLeaseRoundTrip proves the harness talks to a real API server: a Lease is
// created, observed through a watch, updated and deleted.
func TestLeaseRoundTrip(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ns := env().Namespace(t)
	cs := kubernetes.NewForConfigOrDie(env().Config)
	leases := cs.CoordinationV1().Leases(ns)

	w, err := leases.Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("watching leases: %v", err)
	}
	defer w.Stop()

	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "instance-0", Labels: map[string]string{"sharder.dev/ring": "example"}},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       ptr.To("instance-0"),
			LeaseDurationSeconds: ptr.To[int32](15),
			RenewTime:            &metav1.MicroTime{Time: time.Now()},
		},
	}
	created, err := leases.Create(ctx, lease, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating lease: %v", err)
	}
	if created.UID == "" || created.ResourceVersion == "" {
		t.Fatalf("created lease lacks server-set fields: uid=%q resourceVersion=%q", created.UID, created.ResourceVersion)
	}

	expect := func(typ watch.EventType, check func(*coordinationv1.Lease) bool) {
		t.Helper()
		for {
			select {
			case ev, ok := <-w.ResultChan():
				if !ok {
					t.Fatalf("watch closed while waiting for %s", typ)
				}
				l, isLease := ev.Object.(*coordinationv1.Lease)
				if ev.Type == typ && isLease && l.Name == lease.Name && check(l) {
					return
				}
			case <-ctx.Done():
				t.Fatalf("no %s event for lease %s", typ, lease.Name)
			}
		}
	}
	expect(watch.Added, func(*coordinationv1.Lease) bool { return true })

	created.Spec.HolderIdentity = ptr.To("")
	if _, err := leases.Update(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("updating lease: %v", err)
	}
	expect(watch.Modified, func(l *coordinationv1.Lease) bool { return ptr.Deref(l.Spec.HolderIdentity, "x") == "" })

	if err := leases.Delete(ctx, lease.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("deleting lease: %v", err)
	}
	expect(watch.Deleted, func(*coordinationv1.Lease) bool { return true })
	if _, err := leases.Get(ctx, lease.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("lease still readable after delete: %v", err)
	}
}
