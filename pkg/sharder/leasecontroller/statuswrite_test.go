package leasecontroller_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/sharder-dev/sharder/internal/fixture"
	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
)

// statusWriteLeases is the size of the ring of TestRingStatusWriteWork.
const statusWriteLeases = 1000

// TestRingStatusWriteWork writes the status of a ring of 1,000 ready
// instances as the assignment controller does (every member with its
// object count) and checks that a write changing one member's count makes
// the lease controller look at that member's Lease only, not at all of
// them, and that a renewal of a ready instance reconciles nothing and
// publishes no membership. It
// logs the reconciles each write caused and the time the lease and
// membership controllers spent on them (go test -v -run
// TestRingStatusWriteWork).
//
// Not parallel: it counts the reconciles of every lease controller of the
// process.
func TestRingStatusWriteWork(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ring, ns := newRing(t)
	s := startSharder(t, clock.RealClock{}, ring, ns)

	var wg sync.WaitGroup
	sem := make(chan struct{}, 20)
	ids := make([]string, statusWriteLeases)
	for i := range ids {
		ids[i] = fmt.Sprintf("inst-%04d", i)
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			lease := fixture.InstanceLease(ring, ns, ids[i], time.Now(), time.Hour)
			if err := env().Client.Create(ctx, lease); err != nil {
				t.Errorf("creating Lease %s: %v", ids[i], err)
			}
		})
	}
	wg.Wait()
	g.Eventually(func() int {
		n := 0
		for _, m := range s.registry.Members(ring) {
			if m.State == membership.StateReady {
				n++
			}
		}
		return n
	}, time.Minute).Should(Equal(statusWriteLeases))
	quiet(g)

	// writeStatus writes every member with count objects, one member
	// (changed) with changedCount, and returns the Lease reconciles and the
	// time the controllers spent reconciling after it.
	writeStatus := func(count, changedCount int32) (float64, time.Duration) {
		rg := &v1alpha1.ControllerRing{}
		g.Expect(env().Client.Get(ctx, types.NamespacedName{Name: ring}, rg)).To(Succeed())
		updated := rg.DeepCopy()
		updated.Status.Members = make([]v1alpha1.MemberStatus, 0, len(ids))
		for i, id := range ids {
			n := count
			if i == 0 {
				n = changedCount
			}
			updated.Status.Members = append(updated.Status.Members, v1alpha1.MemberStatus{Name: id, State: string(membership.StateReady), Objects: n})
		}
		before, busy := leaseReconciles(), reconcileTime()
		g.Expect(env().Client.Status().Patch(ctx, updated, client.MergeFrom(rg))).To(Succeed())
		quiet(g)
		return leaseReconciles() - before, reconcileTime() - busy
	}

	reconciles, busy := writeStatus(100, 100) // every member appears in the status
	t.Logf("first status write listing %d members: %.0f Lease reconciles, %v reconciling", statusWriteLeases, reconciles, busy.Round(time.Microsecond))
	reconciles, busy = writeStatus(100, 101) // one member's count changes
	t.Logf("status write changing one member's count: %.0f Lease reconciles, %v reconciling", reconciles, busy.Round(time.Microsecond))
	g.Expect(reconciles).To(BeNumerically("<=", 1), "a status write changing one member's count reconciles that member's Lease only")

	// A renewal of a ready instance: recorded as it arrives (the Lease is
	// not reconciled), and the ring's membership is not published again.
	lease := &coordinationv1.Lease{}
	g.Expect(env().Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: ids[1]}, lease)).To(Succeed())
	renewed := lease.DeepCopy()
	renewed.Spec.RenewTime = ptr.To(metav1.NewMicroTime(time.Now()))
	before, ringsBefore, busyBefore := leaseReconciles(), reconcilesOf("membership"), reconcileTime()
	g.Expect(env().Client.Update(ctx, renewed)).To(Succeed())
	quiet(g)
	leases, rings := leaseReconciles()-before, reconcilesOf("membership")-ringsBefore
	t.Logf("renewal of one ready instance: %.0f Lease reconciles, %.0f ring reconciles, %v reconciling", leases, rings, (reconcileTime() - busyBefore).Round(time.Microsecond))
	g.Expect(leases).To(BeZero(), "a renewal of a ready instance reconciles no Lease")
	g.Expect(rings).To(BeZero(), "a renewal of a ready instance publishes no membership")
	m, _ := s.member(ring, ids[1])
	g.Expect(m.State).To(Equal(membership.StateReady))
}

// leaseReconciles is how many reconciles the lease controllers of the
// process have finished.
func leaseReconciles() float64 { return reconcilesOf("lease") }

// reconcilesOf is how many reconciles the controllers named controller have
// finished in the process.
func reconcilesOf(controller string) float64 {
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		panic(err)
	}
	total := 0.0
	for _, f := range families {
		if f.GetName() != "controller_runtime_reconcile_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "controller" && l.GetValue() == controller {
					total += m.GetCounter().GetValue()
				}
			}
		}
	}
	return total
}

// quiet waits until the lease controllers have reconciled nothing for half
// a second.
func quiet(g Gomega) {
	last, since := leaseReconciles(), time.Now()
	g.Eventually(func() bool {
		if n := leaseReconciles(); n != last {
			last, since = n, time.Now()
		}
		return time.Since(since) >= 500*time.Millisecond
	}, time.Minute, 50*time.Millisecond).Should(BeTrue())
}

// reconcileTime is the time the lease and membership controllers of the
// process have spent reconciling.
func reconcileTime() time.Duration {
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		panic(err)
	}
	total := 0.0
	for _, f := range families {
		if f.GetName() != "controller_runtime_reconcile_time_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "controller" && (l.GetValue() == "lease" || l.GetValue() == "membership") {
					total += m.GetHistogram().GetSampleSum()
				}
			}
		}
	}
	return time.Duration(total * float64(time.Second))
}
