package leasecontroller_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/sharder-dev/sharder/internal/fixture"
	"github.com/sharder-dev/sharder/internal/testenv"
	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/sharder/leasecontroller"
)

// sharderIdentity is the identity of the lease controllers under test.
const sharderIdentity = "sharder:test"

var suite testenv.Suite // the control plane, started for the first test that calls env

func env() *testenv.Env { return suite.Env() }

func TestMain(m *testing.M) {
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr)))
	// The tests that run on the real clock use 1-2 s Leases; a loaded
	// machine adds latency. Those on a fake clock wait only for the API
	// server and the controller's work.
	SetDefaultEventuallyTimeout(10 * time.Second)
	SetDefaultEventuallyPollingInterval(20 * time.Millisecond)
	scheme := testenv.DefaultScheme()
	utilruntime.Must(v1alpha1.AddToScheme(scheme))
	os.Exit(testenv.Run(m, &suite, testenv.Options{CRDDirectoryPaths: []string{"config/crd/bases"}, Scheme: scheme}))
}

// sharder is one test's lease controller, on a manager of its own whose
// cache holds only the test's ring and the Leases of the test's namespaces.
type sharder struct {
	clock     clock.WithTicker
	registry  *leasecontroller.Registry
	published *history
	cache     cache.Cache
}

// startSharder starts a lease controller with identity sharderIdentity for
// ring, watching the Leases in namespaces, until the test ends. clk is its
// clock; the published memberships are recorded with it.
func startSharder(t *testing.T, clk clock.WithTicker, ring string, namespaces ...string) *sharder {
	t.Helper()
	return startSharderAs(t, sharderIdentity, clk, ring, namespaces...)
}

// startSharderAs is startSharder with another holder identity.
func startSharderAs(t *testing.T, identity string, clk clock.WithTicker, ring string, namespaces ...string) *sharder {
	t.Helper()
	mgrOpts := env().ManagerOptions()
	byObject := leasecontroller.CacheByObject()
	byObject[&v1alpha1.ControllerRing{}] = cache.ByObject{Field: fields.OneTermEqualSelector("metadata.name", ring)}
	mgrOpts.Cache = cache.Options{ByObject: byObject, DefaultNamespaces: map[string]cache.Config{}}
	for _, ns := range namespaces {
		mgrOpts.Cache.DefaultNamespaces[ns] = cache.Config{}
	}
	mgr := env().NewManager(t, nil, mgrOpts)
	s := &sharder{clock: clk, registry: leasecontroller.NewRegistry(), cache: mgr.GetCache()}
	s.published = &history{now: clk.Now, registry: s.registry}
	s.registry.Subscribe(s.published.record)
	c, err := leasecontroller.New(leasecontroller.Options{Registry: s.registry, Identity: identity, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	testenv.StartManager(t, mgr)
	waitRunning(t, ring, namespaces[0])
	return s
}

// waitRunning waits until the lease controller reconciles Leases: the
// Leases the test creates next are observed as they are written, so that
// timings measured from a write hold. The probe is a Lease of a ring that
// does not exist, with a state label, which the controller removes.
func waitRunning(t *testing.T, ring, namespace string) {
	t.Helper()
	g := NewWithT(t)
	probe := createLease(t, ring+"-none", namespace, "probe", time.Now(), 60, func(l *coordinationv1.Lease) {
		l.Labels[v1alpha1.LabelState] = string(membership.StateReady)
	})
	g.Eventually(getLease(namespace, probe.Name), time.Minute).Should(HaveField("Labels", Not(HaveKey(v1alpha1.LabelState))))
}

// newFakeClock returns a fake clock at the current time, to the microsecond
// (the precision of a Lease's times).
func newFakeClock() *clocktesting.FakeClock {
	return clocktesting.NewFakeClock(time.Now().Truncate(time.Microsecond))
}

// stepTo sets clk to at and waits until cond holds. The controller reads
// the clock when it computes a Lease's next transition; should it have read
// it before the step and registered the requeue after it, the requeue waits
// for a later time that never comes. So, while cond fails, stepTo pokes the
// Leases named (a change of an annotation, which tells no renewal): each
// poke makes the controller look at them at the current time. The wait is
// for the API server and the controller only, so it may be long on a loaded
// machine; a failure lists the Leases as they are.
func stepTo(g Gomega, clk *clocktesting.FakeClock, at time.Time, ns string, leases []string, cond func() bool) {
	clk.SetTime(at)
	polls := 0
	g.Eventually(func() bool {
		if cond() {
			return true
		}
		if polls++; polls%25 == 0 {
			for _, name := range leases {
				poke(ns, name, polls)
			}
		}
		return false
	}, 30*time.Second).Should(BeTrue(), func() string { return describe(ns, leases, at) })
}

// describe tells the holder, renewal, duration and state label of the Leases
// named, for a failure at at.
func describe(ns string, leases []string, at time.Time) string {
	out := fmt.Sprintf("clock at %s:", at.Format(time.RFC3339Nano))
	for _, name := range leases {
		lease, err := getLease(ns, name)()
		if err != nil {
			out += fmt.Sprintf("\n  %s: %v", name, err)
			continue
		}
		out += fmt.Sprintf("\n  %s: holder %q renewed %s for %ds, state %q, resourceVersion %s", name,
			ptr.Deref(lease.Spec.HolderIdentity, ""), ptr.Deref(lease.Spec.RenewTime, metav1.MicroTime{}).Format(time.RFC3339Nano),
			ptr.Deref(lease.Spec.LeaseDurationSeconds, 0), lease.Labels[v1alpha1.LabelState], lease.ResourceVersion)
	}
	return out
}

// poke changes an annotation of a Lease, if it exists.
func poke(ns, name string, n int) {
	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{"test.sharder.dev/poke":"%d"}}}`, n)
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	_ = env().Client.Patch(context.Background(), lease, client.RawPatch(types.MergePatchType, patch))
}

// snapshot is a ring's membership as published at a time.
type snapshot struct {
	at      time.Time
	members []membership.Member
}

// history records every membership a registry publishes, with the time of
// the sharder's clock.
type history struct {
	now      func() time.Time
	registry *leasecontroller.Registry

	mu    sync.Mutex
	rings map[string][]snapshot
}

func (h *history) record(ring string) {
	s := snapshot{at: h.now(), members: h.registry.Members(ring)}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.rings == nil {
		h.rings = map[string][]snapshot{}
	}
	h.rings[ring] = append(h.rings[ring], s)
}

// states returns the distinct successive states of member id in ring, with
// the time each was first published ("" when it left the ring).
func (h *history) states(ring, id string) ([]membership.State, []time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var states []membership.State
	var times []time.Time
	for _, s := range h.rings[ring] {
		state := membership.State("")
		for _, m := range s.members {
			if m.ID == id {
				state = m.State
			}
		}
		previous := membership.State("")
		if len(states) > 0 {
			previous = states[len(states)-1]
		}
		if state != previous {
			states = append(states, state)
			times = append(times, s.at)
		}
	}
	return states, times
}

// firstTime returns when ring's member id was first published in state.
func (h *history) firstTime(ring, id string, state membership.State) (time.Time, bool) {
	states, times := h.states(ring, id)
	for i := range states {
		if states[i] == state {
			return times[i], true
		}
	}
	return time.Time{}, false
}

// member returns ring's member id as currently published.
func (s *sharder) member(ring, id string) (membership.Member, bool) {
	for _, m := range s.registry.Members(ring) {
		if m.ID == id {
			return m, true
		}
	}
	return membership.Member{}, false
}

// stateOf returns the published state of ring's member id, "" if none.
func (s *sharder) stateOf(ring, id string) func() membership.State {
	return func() membership.State {
		m, _ := s.member(ring, id)
		return m.State
	}
}

var ringCounter struct {
	sync.Mutex
	n int
}

// newRing creates a ring with a fresh lease namespace and deletes it at the
// end of the test.
func newRing(t *testing.T) (ring, namespace string) {
	t.Helper()
	namespace = env().Namespace(t)
	ringCounter.Lock()
	ringCounter.n++
	ring = fmt.Sprintf("ring-%d", ringCounter.n)
	ringCounter.Unlock()
	fixture.Create(t, env().Client, fixture.Ring(ring, namespace, nil))
	return ring, namespace
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
