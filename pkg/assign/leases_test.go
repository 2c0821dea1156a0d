package assign_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/assign"
	"github.com/sharder-dev/sharder/pkg/leases"
)

func createLease(t *testing.T, ns, id string) *coordinationv1.Lease {
	t.Helper()
	now := metav1.NewMicroTime(time.Now())
	l := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: id, Labels: map[string]string{v1alpha1.LabelRing: ns}},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       ptr.To(id),
			LeaseDurationSeconds: ptr.To[int32](3600),
			AcquireTime:          &now,
			RenewTime:            &now,
		},
	}
	if err := env.Client.Create(context.Background(), l); err != nil {
		t.Fatalf("creating Lease: %v", err)
	}
	return l
}

// TestWithLeaseController runs the assignment controller behind the real
// lease controller: instances are Leases, and a released Lease moves its
// objects at once.
func TestWithLeaseController(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := env.Namespace(t)
	newRing(t, ns, nil)
	createLease(t, ns, "a")
	b := createLease(t, ns, "b")
	names := createConfigMaps(t, ns, "cm", 20)
	reg := leases.NewRegistry()
	startSharderWith(t, env.Config, reg, assign.Options{}, func(mgr ctrl.Manager) error {
		return leases.NewController(leases.ControllerOptions{Registry: reg}).SetupWithManager(mgr)
	})

	both := []string{"a", "b"}
	g.Eventually(func(g Gomega) {
		got := labelsOf(g, ns)
		for _, name := range names {
			g.Expect(got[name]).To(HaveKeyWithValue(v1alpha1.ShardLabel(ns), expected(t, both, ns, name)))
		}
	}, timeout, poll).Should(Succeed())

	// Instance b shuts down and releases its Lease: its objects go to a.
	h := watchHistory(t, configMaps, ns, ns)
	g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(b), b)).To(Succeed())
	b.Spec.HolderIdentity = nil
	g.Expect(env.Client.Update(ctx, b)).To(Succeed())
	g.Eventually(func(g Gomega) {
		for _, l := range labelsOf(g, ns) {
			g.Expect(l).To(HaveKeyWithValue(v1alpha1.ShardLabel(ns), "a"))
		}
	}, timeout, poll).Should(Succeed())
	for _, name := range names {
		g.Expect(h.drained(name)).To(BeFalse(), "%s was drained from a released instance", name)
	}
	g.Eventually(func(g Gomega) {
		r := getRing(g, ns)
		g.Expect(r.Status.AvailableInstances).To(BeEquivalentTo(1))
		g.Expect(r.Status.Instances).To(BeEquivalentTo(2))
	}, timeout, poll).Should(Succeed())
}
