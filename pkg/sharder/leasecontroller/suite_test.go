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
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/sharder-dev/sharder/internal/testenv"
	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/sharder/leasecontroller"
)

// sharderIdentity is the identity of the lease controller under test.
const sharderIdentity = "sharder:test"

var (
	env *testenv.Env
	// registry is the lease controller's output, shared by all tests (each
	// test uses its own ring).
	registry = leasecontroller.NewRegistry()
	// sharderCache is the manager's cache.
	sharderCache cache.Cache
	published    = &history{}
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr)))
	// Lease timings in these tests are 1-2 s; a loaded machine adds latency.
	SetDefaultEventuallyTimeout(10 * time.Second)
	SetDefaultEventuallyPollingInterval(20 * time.Millisecond)
	scheme := testenv.DefaultScheme()
	utilruntime.Must(v1alpha1.AddToScheme(scheme))
	var err error
	env, err = testenv.Start(testenv.Options{CRDDirectoryPaths: []string{"config/crd/bases"}, Scheme: scheme})
	if err != nil {
		fmt.Fprintf(os.Stderr, "starting the control plane: %v\n", err)
		return 1
	}
	defer func() { _ = env.Stop() }()

	mgrOpts := env.ManagerOptions()
	mgrOpts.Cache = cache.Options{ByObject: leasecontroller.CacheByObject()}
	mgr, err := ctrl.NewManager(env.Config, mgrOpts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "creating the manager: %v\n", err)
		return 1
	}
	registry.Subscribe(published.record)
	err = leasecontroller.NewController(leasecontroller.ControllerOptions{Registry: registry, Identity: sharderIdentity}).SetupWithManager(mgr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "setting up the lease controller: %v\n", err)
		return 1
	}
	sharderCache = mgr.GetCache()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	code := m.Run()
	cancel()
	if err := <-done; err != nil {
		fmt.Fprintf(os.Stderr, "manager: %v\n", err)
	}
	return code
}

// snapshot is a ring's membership as published at a time.
type snapshot struct {
	at      time.Time
	members []membership.Member
}

// history records every membership the registry publishes.
type history struct {
	mu    sync.Mutex
	rings map[string][]snapshot
}

func (h *history) record(ring string) {
	s := snapshot{at: time.Now(), members: registry.Members(ring)}
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
func member(ring, id string) (membership.Member, bool) {
	for _, m := range registry.Members(ring) {
		if m.ID == id {
			return m, true
		}
	}
	return membership.Member{}, false
}

// stateOf returns the published state of ring's member id, "" if none.
func stateOf(ring, id string) func() membership.State {
	return func() membership.State {
		m, _ := member(ring, id)
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
	g := NewWithT(t)
	namespace = env.Namespace(t)
	ringCounter.Lock()
	ringCounter.n++
	ring = fmt.Sprintf("ring-%d", ringCounter.n)
	ringCounter.Unlock()
	obj := &v1alpha1.ControllerRing{
		ObjectMeta: metav1.ObjectMeta{Name: ring},
		Spec: v1alpha1.ControllerRingSpec{
			LeaseNamespace: namespace,
			Resources:      []v1alpha1.RingResource{{Resource: "configmaps"}},
		},
	}
	g.Expect(env.Client.Create(context.Background(), obj)).To(Succeed())
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), obj) })
	return ring, namespace
}

// createLease creates an instance Lease as an instance would, renewed at
// renew (the instance then stops renewing, as if it crashed).
func createLease(t *testing.T, ring, namespace, id string, renew time.Time, seconds int32, mutate ...func(*coordinationv1.Lease)) *coordinationv1.Lease {
	t.Helper()
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: id, Namespace: namespace, Labels: map[string]string{v1alpha1.LabelRing: ring}},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       ptr.To(id),
			AcquireTime:          ptr.To(metav1.NewMicroTime(renew)),
			RenewTime:            ptr.To(metav1.NewMicroTime(renew)),
			LeaseDurationSeconds: ptr.To(seconds),
		},
	}
	for _, m := range mutate {
		m(lease)
	}
	NewWithT(t).Expect(env.Client.Create(context.Background(), lease)).To(Succeed())
	return lease
}

// getLease reads a Lease from the API server.
func getLease(namespace, name string) func() (*coordinationv1.Lease, error) {
	return func() (*coordinationv1.Lease, error) {
		lease := &coordinationv1.Lease{}
		err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: namespace, Name: name}, lease)
		return lease, err
	}
}
