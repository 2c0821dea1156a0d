package metrics

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"testing"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// TestRegister checks that Register registers every family defined in this
// package and only where it is told to.
func TestRegister(t *testing.T) {
	g := NewWithT(t)

	// Every family the package defines (Name: "sharder_...") is registered.
	files, err := filepath.Glob("*.go")
	g.Expect(err).NotTo(HaveOccurred())
	nameRE := regexp.MustCompile(`Name:\s+"(sharder_[a-z_]+)"`)
	var defined []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		g.Expect(err).NotTo(HaveOccurred())
		for _, m := range nameRE.FindAllStringSubmatch(string(data), -1) {
			defined = append(defined, m[1])
		}
	}
	g.Expect(defined).NotTo(BeEmpty())

	r := prometheus.NewPedanticRegistry()
	g.Expect(Register(r)).To(Succeed())
	for _, name := range defined {
		clash := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: "a clash"})
		g.Expect(r.Register(clash)).To(HaveOccurred(), "%s is registered", name)
	}

	// Again on the same registry: the same collectors, no error.
	g.Expect(Register(r)).To(Succeed())

	// Another collector under one of the names is refused.
	other := prometheus.NewPedanticRegistry()
	g.Expect(other.Register(prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sharder_moves_total", Help: "a clash",
	}, []string{LabelRing, LabelReason}))).To(Succeed())
	g.Expect(Register(other)).To(MatchError(ContainSubstring("sharder_moves_total")))

	g.Expect(slices.Compact(slices.Sorted(slices.Values(defined)))).To(HaveLen(len(collectors())), "one collector per family")
}

// TestImportRegistersNothing checks that importing the package leaves
// controller-runtime's global registry, which a controller embedding parts of
// the project serves as its own, alone.
func TestImportRegistersNothing(t *testing.T) {
	g := NewWithT(t)
	for _, c := range collectors() {
		g.Expect(crmetrics.Registry.Register(c)).To(Succeed())
		crmetrics.Registry.Unregister(c)
	}
}

// TestSetRingInfo checks that a ring has one info series, which follows its
// spec, and none once the ring is forgotten.
func TestSetRingInfo(t *testing.T) {
	g := NewWithT(t)
	t.Cleanup(func() { ForgetRing("info-test") })
	SetRingInfo("info-test", true)
	g.Expect(testutil.ToFloat64(RingInfo.WithLabelValues("info-test", AcknowledgementsExpected))).To(Equal(1.0))
	g.Expect(testutil.CollectAndCount(RingInfo)).To(Equal(1))

	SetRingInfo("info-test", false)
	g.Expect(testutil.CollectAndCount(RingInfo)).To(Equal(1), "the ring's earlier series is gone")
	g.Expect(testutil.ToFloat64(RingInfo.WithLabelValues("info-test", AcknowledgementsNone))).To(Equal(1.0))
	g.Expect(testutil.CollectAndCount(RingInfo)).To(Equal(1))

	ForgetRing("info-test")
	g.Expect(testutil.CollectAndCount(RingInfo)).To(Equal(0))
}

// TestRingCountersStartAtZero checks that a ring's counters exist at 0 as
// soon as the ring is known: Prometheus's increase() does not count the
// first sample of a series, so a counter created by its first move would
// hide that move from the alerts.
func TestRingCountersStartAtZero(t *testing.T) {
	g := NewWithT(t)
	t.Cleanup(func() { ForgetRing("counters-test") })
	SetRingInfo("counters-test", true)
	for _, reason := range []string{MoveRebalance, MoveDead, MoveForced} {
		g.Expect(testutil.ToFloat64(MovesTotal.WithLabelValues("counters-test", reason))).To(Equal(0.0))
	}
	g.Expect(testutil.CollectAndCount(MovesTotal)).To(Equal(3), "a series per reason before any move")
	g.Expect(testutil.CollectAndCount(AssignmentsTotal)).To(Equal(1))
	g.Expect(testutil.CollectAndCount(DrainsTotal)).To(Equal(1))

	MovesTotal.WithLabelValues("counters-test", MoveForced).Inc()
	SetRingInfo("counters-test", true)
	g.Expect(testutil.ToFloat64(MovesTotal.WithLabelValues("counters-test", MoveForced))).To(Equal(1.0), "known again: nothing is reset")

	ForgetRing("counters-test")
	g.Expect(testutil.CollectAndCount(MovesTotal)).To(Equal(0))
}
