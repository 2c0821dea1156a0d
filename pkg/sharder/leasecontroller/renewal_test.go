package leasecontroller_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
)

// TestRenewalCountsFromItsArrival checks that a renewal of a ready
// instance, which the lease controller records without a reconcile, counts
// from when it arrived, not from when the Lease is next reconciled: with the
// sharder on a fake clock, a Lease of 10 s renewed at +5 s is still ready
// when its first expiry (+10 s) is looked at, and expired from +15 s.
func TestRenewalCountsFromItsArrival(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ctx := context.Background()
	clk := newFakeClock()
	ring, ns := newRing(t)
	s := startSharder(t, clk, ring, ns)
	start := clk.Now()
	createLease(t, ring, ns, "renewing", start, 10)
	g.Eventually(getLease(ns, "renewing")).Should(HaveField("Labels", HaveKeyWithValue(v1alpha1.LabelState, "ready")))
	g.Expect(s.stateOf(ring, "renewing")()).To(Equal(membership.StateReady))

	// The instance renews at +5 s.
	clk.SetTime(start.Add(5 * time.Second))
	lease, err := getLease(ns, "renewing")()
	g.Expect(err).NotTo(HaveOccurred())
	renewed := lease.DeepCopy()
	renewed.Spec.RenewTime = ptr.To(metav1.NewMicroTime(clk.Now()))
	g.Expect(env().Client.Update(ctx, renewed)).To(Succeed())
	// The controller sees the Lease events in order: once it has handled a
	// probe created after the renewal, it has handled the renewal, at +5 s.
	probe := createLease(t, ring+"-none", ns, "after-renewal", clk.Now(), 60, func(l *coordinationv1.Lease) {
		l.Labels[v1alpha1.LabelState] = string(membership.StateReady)
	})
	g.Eventually(getLease(ns, probe.Name)).Should(HaveField("Labels", Not(HaveKey(v1alpha1.LabelState))))

	// Past the first expiry: the reconcile queued for +10 s finds the
	// renewal of +5 s and keeps the instance ready.
	stepTo(g, clk, start.Add(12*time.Second), ns, []string{"renewing"}, func() bool { return true })
	g.Consistently(s.stateOf(ring, "renewing"), 500*time.Millisecond).Should(Equal(membership.StateReady))
	// Expired at +15 s: ten seconds after the renewal arrived.
	stepTo(g, clk, start.Add(15*time.Second), ns, []string{"renewing"}, func() bool {
		return s.stateOf(ring, "renewing")() == membership.StateExpired
	})
	states, _ := s.published.states(ring, "renewing")
	g.Expect(states).To(Equal([]membership.State{membership.StateReady, membership.StateExpired}))
	expired, _ := s.published.firstTime(ring, "renewing", membership.StateExpired)
	g.Expect(expired).To(BeTemporally(">=", start.Add(15*time.Second)), "not expired before the renewal's duration ended")
}
