package assign_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/sharder/assign"
	"github.com/sharder-dev/sharder/pkg/sharder/leasecontroller"
	"github.com/sharder-dev/sharder/pkg/sharder/metrics"
)

// ringEvents returns "<reason>: <note>" of every event recorded about the
// ring.
func ringEvents(g Gomega, ringName string) []string {
	list := &eventsv1.EventList{}
	g.Expect(env().Client.List(context.Background(), list)).To(Succeed())
	var out []string
	for _, e := range list.Items {
		if e.Regarding.Kind == "ControllerRing" && e.Regarding.Name == ringName {
			out = append(out, e.Reason+": "+e.Note)
		}
	}
	return out
}

// TestRingEventsOnJoin: the sharder records on the ControllerRing who
// joined, and how many objects the rebalance moves and how: drained from
// the ready instances.
func TestRingEventsOnJoin(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	two, three := []string{"a", "b"}, []string{"a", "b", "c"}
	reg := leasecontroller.NewRegistry()
	reg.Set(ns, members(membership.StateReady, two...))
	newRing(t, ns, nil)
	names := createConfigMaps(t, ns, "cm", 30)
	acknowledger(t, ns, ns, func(string) bool { return true })
	startSharder(t, reg, assign.Options{})
	waitAssigned(g, t, ns, names, two)

	toC := moving(t, ns, names, two, three)
	g.Expect(toC).NotTo(BeEmpty())
	reg.Set(ns, members(membership.StateReady, three...))
	g.Eventually(func(g Gomega) []string { return ringEvents(g, ns) }, timeout, poll).Should(ContainElements(
		"MembershipChanged: c joined (ready); 3 of 3 instances ready",
		fmt.Sprintf("Rebalancing: Moving %d of %d objects: %d drained from ready instances, 0 relabelled from instances that are gone, 0 held on instances that may still be working",
			len(toC), len(names), len(toC)),
	))
	waitAssigned(g, t, ns, names, three)
}

// TestRingEventsOnDeath: an instance that dies is recorded with its state
// change, and its objects as relabelled at once.
func TestRingEventsOnDeath(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	two, three := []string{"a", "b"}, []string{"a", "b", "c"}
	reg := leasecontroller.NewRegistry()
	reg.Set(ns, members(membership.StateReady, three...))
	newRing(t, ns, nil)
	names := createConfigMaps(t, ns, "cm", 30)
	startSharder(t, reg, assign.Options{})
	waitAssigned(g, t, ns, names, three)

	onC := moving(t, ns, names, three, two)
	g.Expect(onC).NotTo(BeEmpty())
	reg.Set(ns, append(members(membership.StateReady, two...), members(membership.StateDead, "c")...))
	g.Eventually(func(g Gomega) []string { return ringEvents(g, ns) }, timeout, poll).Should(ContainElements(
		"MembershipChanged: c ready -> dead; 2 of 3 instances ready",
		fmt.Sprintf("Rebalancing: Moving %d of %d objects: 0 drained from ready instances, %d relabelled from instances that are gone, 0 held on instances that may still be working",
			len(onC), len(names), len(onC)),
	))
	waitAssigned(g, t, ns, names, two)
}

// eventsWithin is how soon an event's text must reach the API server.
const eventsWithin = 5 * time.Second

// TestRingEventsTwoMembershipChanges: two successive membership changes of
// one ring are two events, each with its own text, written within seconds:
// the second is neither folded into the first (which would keep the first
// text) nor held back until a periodic refresh.
func TestRingEventsTwoMembershipChanges(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	two, three := []string{"a", "b"}, []string{"a", "b", "c"}
	reg := leasecontroller.NewRegistry()
	reg.Set(ns, members(membership.StateReady, two...))
	newRing(t, ns, nil)
	names := createConfigMaps(t, ns, "cm", 30)
	acknowledger(t, ns, ns, func(string) bool { return true })
	startSharder(t, reg, assign.Options{})
	waitAssigned(g, t, ns, names, two)

	reg.Set(ns, members(membership.StateReady, three...))
	joined := "MembershipChanged: c joined (ready); 3 of 3 instances ready"
	g.Eventually(func(g Gomega) []string { return ringEvents(g, ns) }, eventsWithin, poll).Should(ContainElement(joined))
	waitAssigned(g, t, ns, names, three)

	reg.Set(ns, append(members(membership.StateReady, two...), members(membership.StateDead, "c")...))
	died := "MembershipChanged: c ready -> dead; 2 of 3 instances ready"
	g.Eventually(func(g Gomega) []string { return ringEvents(g, ns) }, eventsWithin, poll).Should(ContainElements(joined, died))
	waitAssigned(g, t, ns, names, two)
}

// TestAssignmentMetrics follows the assignment counters of one ring through
// first assignment, a drain that times out, drains that are acknowledged
// and an instance that dies. An object is counted once per step: its first
// assignment, or a move by its reason, never both.
func TestAssignmentMetrics(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	const drainTimeout = 30 * time.Second
	one, two, three := []string{"a"}, []string{"a", "b"}, []string{"a", "b", "c"}
	reg := leasecontroller.NewRegistry()
	reg.Set(ns, members(membership.StateReady, one...))
	newRing(t, ns, func(s *v1alpha1.ControllerRingSpec) { s.DrainTimeout = &metav1.Duration{Duration: drainTimeout} })
	names := createConfigMaps(t, ns, "cm", 30)
	// Drains time out only when the test moves the clock.
	clk := clocktesting.NewFakeClock(time.Now())
	startSharder(t, reg, assign.Options{Clock: clk})

	type counters struct{ assignments, drains, rebalance, dead, forced int }
	read := func() counters {
		return counters{
			assignments: int(testutil.ToFloat64(metrics.AssignmentsTotal.WithLabelValues(ns))),
			drains:      int(testutil.ToFloat64(metrics.DrainsTotal.WithLabelValues(ns))),
			rebalance:   int(testutil.ToFloat64(metrics.MovesTotal.WithLabelValues(ns, metrics.MoveRebalance))),
			dead:        int(testutil.ToFloat64(metrics.MovesTotal.WithLabelValues(ns, metrics.MoveDead))),
			forced:      int(testutil.ToFloat64(metrics.MovesTotal.WithLabelValues(ns, metrics.MoveForced))),
		}
	}
	waitAssigned(g, t, ns, names, one)
	want := counters{assignments: len(names)}
	g.Eventually(read, timeout, poll).Should(Equal(want))

	// b joins and nobody acknowledges: the drains are forced at the timeout.
	toB := moving(t, ns, names, one, two)
	g.Expect(toB).NotTo(BeEmpty())
	reg.Set(ns, members(membership.StateReady, two...))
	want.drains += len(toB)
	g.Eventually(read, timeout, poll).Should(Equal(want))
	g.Eventually(func(g Gomega) {
		for name, l := range labelsOf(g, ns) {
			if expected(t, two, ns, name) == "b" {
				g.Expect(l).To(HaveKey(v1alpha1.DrainLabel(ns)), name)
			}
		}
	}, timeout, poll).Should(Succeed())
	clk.Step(drainTimeout)
	g.Eventually(func(g Gomega) { // released from a, the drain label kept
		for name, l := range labelsOf(g, ns) {
			if expected(t, two, ns, name) == "b" {
				g.Expect(l).NotTo(HaveKey(v1alpha1.ShardLabel(ns)), name)
			}
		}
	}, timeout, poll).Should(Succeed())
	// The grace counts from when the sharder saw each release land, just
	// after its write: the clock goes on until every object is assigned.
	clk.Step(assign.ForceGrace)
	g.Eventually(func(g Gomega) {
		clk.Step(10 * time.Millisecond)
		got := labelsOf(g, ns)
		for _, name := range names {
			g.Expect(got[name]).To(HaveKeyWithValue(v1alpha1.ShardLabel(ns), expected(t, two, ns, name)), name)
			g.Expect(got[name]).NotTo(HaveKey(v1alpha1.DrainLabel(ns)), name)
		}
	}, timeout, poll).Should(Succeed())
	want.forced += len(toB)
	g.Eventually(read, timeout, poll).Should(Equal(want))

	// c joins and the instances acknowledge: moves by rebalance.
	acknowledger(t, ns, ns, func(string) bool { return true })
	toC := moving(t, ns, names, two, three)
	g.Expect(toC).NotTo(BeEmpty())
	reg.Set(ns, members(membership.StateReady, three...))
	waitAssigned(g, t, ns, names, three)
	want.drains += len(toC)
	want.rebalance += len(toC)
	g.Eventually(read, timeout, poll).Should(Equal(want))

	// c dies: its objects move at once, without a drain.
	reg.Set(ns, append(members(membership.StateReady, two...), members(membership.StateDead, "c")...))
	waitAssigned(g, t, ns, names, two)
	want.dead += len(toC)
	g.Eventually(read, timeout, poll).Should(Equal(want))
	g.Consistently(read, time.Second, poll).Should(Equal(want))
}

// listCounter counts the requests passing through a rest.Config's
// transport that read a whole collection (see readsCollection).
type listCounter struct {
	counting atomic.Bool
	before   atomic.Int64
	mu       sync.Mutex
	lists    []string
}

func (c *listCounter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
		if readsCollection(req) {
			if c.counting.Load() {
				c.mu.Lock()
				c.lists = append(c.lists, req.URL.String())
				c.mu.Unlock()
			} else {
				c.before.Add(1)
			}
		}
		return rt.RoundTrip(req)
	})
}

func (c *listCounter) counted() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.lists...)
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// readsCollection reports whether req reads a whole collection from the API
// server: a LIST (a GET of /api/v1/[namespaces/NS/]RESOURCE or
// /apis/GROUP/VERSION/[namespaces/NS/]RESOURCE without watch), or a watch
// that starts by sending every object (sendInitialEvents=true, the
// streaming list informers use in place of a LIST).
func readsCollection(req *http.Request) bool {
	if req.Method != http.MethodGet {
		return false
	}
	q := req.URL.Query()
	if w := q.Get("watch"); (w == "true" || w == "1") && q.Get("sendInitialEvents") != "true" {
		return false
	}
	segs := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	switch {
	case len(segs) >= 2 && segs[0] == "api":
		segs = segs[2:]
	case len(segs) >= 3 && segs[0] == "apis":
		segs = segs[3:]
	default:
		return false // discovery and other paths
	}
	if len(segs) >= 3 && segs[0] == "namespaces" {
		segs = segs[2:]
	}
	return len(segs) == 1
}

func TestReadsCollection(t *testing.T) {
	for url, want := range map[string]bool{
		"/api/v1/namespaces/ns/configmaps?limit=500":        true,
		"/api/v1/configmaps?resourceVersion=0":              true,
		"/api/v1/namespaces":                                true,
		"/apis/sharder.dev/v1alpha1/controllerrings":        true,
		"/apis/coordination.k8s.io/v1/namespaces/ns/leases": true,
		"/api/v1/namespaces/ns/configmaps?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan": true,
		"/api/v1/namespaces/ns/configmaps?watch=true&resourceVersion=12":                                       false,
		"/api/v1/namespaces/ns/configmaps?watch=true":                                                          false,
		"/apis/sharder.dev/v1alpha1/controllerrings?watch=1":                                                   false,
		"/api/v1/namespaces/ns":                                        false,
		"/api/v1/namespaces/ns/configmaps/cm-1":                        false,
		"/apis/sharder.dev/v1alpha1/controllerrings/ring":              false,
		"/apis/sharder.dev/v1alpha1/controllerrings/ring/status":       false,
		"/apis/coordination.k8s.io/v1/namespaces/ns/leases/instance-0": false,
		"/api": false, "/apis": false, "/apis/sharder.dev/v1alpha1": false, "/api/v1": false,
	} {
		req, err := http.NewRequest(http.MethodGet, "https://apiserver"+url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := readsCollection(req); got != want {
			t.Errorf("readsCollection(GET %s) = %v, want %v", url, got, want)
		}
	}
}

// TestRebalanceListsNothing counts the sharder's LIST requests (and watches
// that start with the whole collection): after its caches are loaded, a
// rebalance (an instance joins, objects are drained and moved) is computed
// from the caches alone, without reading a collection again.
func TestRebalanceListsNothing(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	two, three := []string{"a", "b"}, []string{"a", "b", "c"}
	reg := leasecontroller.NewRegistry()
	reg.Set(ns, members(membership.StateReady, two...))
	newRing(t, ns, nil)
	names := createConfigMaps(t, ns, "cm", 40)
	acknowledger(t, ns, ns, func(string) bool { return true })

	counter := &listCounter{}
	cfg := rest.CopyConfig(env().Config)
	cfg.Wrap(counter.wrap)
	startSharderWith(t, cfg, reg, assign.Options{}, nil)
	waitAssigned(g, t, ns, names, two)
	g.Eventually(func(g Gomega) {
		r := getRing(g, ns)
		g.Expect(meta.IsStatusConditionTrue(r.Status.Conditions, v1alpha1.ConditionReady)).To(BeTrue())
	}, timeout, poll).Should(Succeed())
	// The counter sees the sharder's requests: loading its caches read
	// every collection it watches.
	g.Expect(counter.before.Load()).To(BeNumerically(">", 0), "loading the caches was not counted")
	t.Logf("%d collections read while the caches loaded", counter.before.Load())

	counter.counting.Store(true)
	toC := moving(t, ns, names, two, three)
	g.Expect(toC).NotTo(BeEmpty())
	reg.Set(ns, members(membership.StateReady, three...))
	waitAssigned(g, t, ns, names, three)
	g.Expect(counter.counted()).To(BeEmpty(), "collections read during the rebalance")
}
