package assign_test

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/sharder/assign"
	"github.com/sharder-dev/sharder/pkg/sharder/leasecontroller"
	"github.com/sharder-dev/sharder/pkg/sharder/metrics"
)

// ringInfo returns the drain_acknowledgements value of every
// sharder_ring_info series of ring, with the series' value.
func ringInfo(ring string) map[string]float64 {
	ch := make(chan prometheus.Metric, 100)
	go func() { metrics.RingInfo.Collect(ch); close(ch) }()
	found := map[string]float64{}
	for m := range ch {
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			continue
		}
		labels := map[string]string{}
		for _, l := range pb.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels[metrics.LabelRing] == ring {
			found[labels[metrics.LabelDrainAcknowledgements]] = pb.GetGauge().GetValue()
		}
	}
	return found
}

// TestRingInfo checks that sharder_ring_info says whether a ring's forced
// moves are by design (it names no instanceServiceAccounts, as a ring of
// sharder agent) as its spec changes, and goes with the ring.
func TestRingInfo(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	reg := leasecontroller.NewRegistry()
	reg.Set(ns, members(membership.StateReady, "a"))
	ring := newRing(t, ns, nil)
	startSharder(t, reg, assign.Options{})

	g.Eventually(func() map[string]float64 { return ringInfo(ns) }, timeout, poll).
		Should(Equal(map[string]float64{metrics.AcknowledgementsNone: 1}))

	ctx := context.Background()
	base := ring.DeepCopy()
	ring.Spec.InstanceServiceAccounts = []v1alpha1.ServiceAccountReference{{Namespace: ns, Name: "controller"}}
	g.Expect(env().Client.Patch(ctx, ring, client.MergeFrom(base))).To(Succeed())
	g.Eventually(func() map[string]float64 { return ringInfo(ns) }, timeout, poll).
		Should(Equal(map[string]float64{metrics.AcknowledgementsExpected: 1}))

	g.Expect(env().Client.Delete(ctx, ring)).To(Succeed())
	g.Eventually(func() map[string]float64 { return ringInfo(ns) }, timeout, poll).Should(BeEmpty())
}
