package assign_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/instance/leaseholder"
	"github.com/sharder-dev/sharder/pkg/sharder/assign"
	"github.com/sharder-dev/sharder/pkg/sharder/leasecontroller"
)

// The restart scenarios run the sharder (lease and assignment controllers)
// with simulated instances that hold their Leases with the real holder, so
// that they acquire a Lease only as the holder's rules allow. Each records
// the spans of the API server's history (resourceVersions) in which one of
// its processes held the Lease; an object moved without a drain from an
// instance while it held its Lease would be reconciled by two instances.

// restartLease is the instances' lease duration in these scenarios.
const restartLease = 3 * time.Second

// quickRecovery bounds the recovery of instances that come back with their
// Leases still theirs: 2 s, plus one lease duration for an instance whose
// renewal was answered too late on a loaded machine, which loses its Lease
// and acquires it again (a run at load 8 took longer than 2 s so).
const quickRecovery = 2*time.Second + restartLease

// span is a stretch of the API server's history, in resourceVersions, in
// which an instance's process held its Lease; to is 0 while it still does.
type span struct{ from, to int64 }

// simInstance is an instance of a ring simulated by its Lease holder.
type simInstance struct {
	t       *testing.T
	id, ns  string
	release leaseholder.Release

	mu      sync.Mutex
	spans   []span
	holder  *leaseholder.Holder
	cancel  context.CancelFunc
	done    chan error
	killed  *atomic.Bool
	stopped bool
}

func newSimInstance(t *testing.T, ns, id string, release leaseholder.Release) *simInstance {
	s := &simInstance{t: t, id: id, ns: ns, release: release}
	t.Cleanup(func() { s.kill() })
	return s
}

// currentRevision returns the API server's current resourceVersion: every
// write after the call has a larger one.
func currentRevision(t *testing.T) int64 {
	t.Helper()
	list := &corev1.NamespaceList{}
	if err := env().Client.List(context.Background(), list, client.Limit(1)); err != nil {
		t.Fatalf("reading the current resourceVersion: %v", err)
	}
	rv, err := strconv.ParseInt(list.ResourceVersion, 10, 64)
	if err != nil {
		t.Fatalf("resourceVersion %q: %v", list.ResourceVersion, err)
	}
	return rv
}

// start starts a new process of the instance.
func (s *simInstance) start() {
	s.mu.Lock()
	defer s.mu.Unlock()
	killed := &atomic.Bool{}
	direct, err := client.NewWithWatch(env().Config, client.Options{Scheme: env().Client.Scheme()})
	if err != nil {
		s.t.Fatalf("client for %s: %v", s.id, err)
	}
	// The process's writes: a write that makes the Lease this process's
	// opens a span, its release closes it. A killed process writes nothing.
	c := interceptor.NewClient(direct, interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if killed.Load() {
				return errors.New("killed")
			}
			err := c.Create(ctx, obj, opts...)
			s.wrote(obj, err)
			return err
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			if killed.Load() {
				return errors.New("killed")
			}
			err := c.Update(ctx, obj, opts...)
			s.wrote(obj, err)
			return err
		},
	})
	newHolder := func() *leaseholder.Holder {
		h, err := leaseholder.NewHolder(c, leaseholder.Options{
			Ring: s.ns, Namespace: s.ns, Identity: s.id, LeaseDuration: restartLease, Release: s.release,
			OnLost: func() { s.closeSpan(currentRevision(s.t)) },
		})
		if err != nil {
			s.t.Fatalf("holder %s: %v", s.id, err)
		}
		return h
	}
	h := newHolder()
	ctx, cancel := context.WithCancel(ctrl.LoggerInto(context.Background(), ctrl.Log.WithName(s.id)))
	s.holder, s.cancel, s.done, s.killed, s.stopped = h, cancel, make(chan error, 1), killed, false
	done := s.done
	go func() {
		for {
			err := h.Start(ctx)
			if !errors.Is(err, leaseholder.ErrLeaseLost) || ctx.Err() != nil || killed.Load() {
				done <- err
				return
			}
			// A process that lost its Lease (a renewal answered too late on
			// a loaded machine) exits and is started again, as a kubelet
			// restarts its container.
			s.t.Logf("instance %s lost its Lease (%v): starting it again", s.id, err)
			h = newHolder()
			s.mu.Lock()
			s.holder = h
			s.mu.Unlock()
		}
	}()
}

// wrote records a write of the Lease by the running process.
func (s *simInstance) wrote(obj client.Object, err error) {
	l, ok := obj.(*coordinationv1.Lease)
	if !ok || err != nil {
		return
	}
	rv, perr := strconv.ParseInt(l.ResourceVersion, 10, 64)
	if perr != nil {
		s.t.Errorf("resourceVersion %q: %v", l.ResourceVersion, perr)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	open := len(s.spans) > 0 && s.spans[len(s.spans)-1].to == 0
	switch holder := ptr.Deref(l.Spec.HolderIdentity, ""); {
	case holder == s.id && !open:
		s.spans = append(s.spans, span{from: rv})
	case holder != s.id && open:
		s.spans[len(s.spans)-1].to = rv
	}
}

func (s *simInstance) closeSpan(rv int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := len(s.spans); n > 0 && s.spans[n-1].to == 0 {
		s.spans[n-1].to = rv
	}
}

// held reports whether the running process holds the Lease.
func (s *simInstance) held() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.holder != nil && !s.stopped && s.holder.Held()
}

// stop stops the process gracefully: it hands its Lease back.
func (s *simInstance) stop() {
	s.mu.Lock()
	cancel, done := s.cancel, s.done
	s.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	if err := <-done; err != nil {
		s.t.Errorf("instance %s stopped with %v", s.id, err)
	}
	s.mu.Lock()
	s.stopped, s.cancel = true, nil
	s.mu.Unlock()
}

// kill stops the process as kill -9 does: it writes nothing more, and its
// Lease stays as it was.
func (s *simInstance) kill() {
	s.mu.Lock()
	cancel, done, killed := s.cancel, s.done, s.killed
	s.mu.Unlock()
	if cancel == nil {
		return
	}
	killed.Store(true)
	s.closeSpan(currentRevision(s.t))
	cancel()
	if err := <-done; err != nil {
		s.t.Logf("killed instance stopped with: %v", err) // whatever it was, it writes nothing more
	}
	s.mu.Lock()
	s.stopped, s.cancel = true, nil
	s.mu.Unlock()
}

// holding reports whether one of the instance's processes held its Lease
// at resourceVersion rv.
func (s *simInstance) holding(rv int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sp := range s.spans {
		if sp.from <= rv && (sp.to == 0 || rv < sp.to) {
			return true
		}
	}
	return false
}

// restartScenario is a ring of simulated instances and its objects under a
// running sharder.
type restartScenario struct {
	ns        string
	names     []string
	instances map[string]*simInstance
	history   *history
}

func newRestartScenario(t *testing.T, release leaseholder.Release, mutate func(*v1alpha1.ControllerRingSpec), ids ...string) *restartScenario {
	t.Helper()
	g := NewWithT(t)
	ns := env().Namespace(t)
	newRing(t, ns, mutate)
	sc := &restartScenario{ns: ns, instances: map[string]*simInstance{}}
	for _, id := range ids {
		sc.instances[id] = newSimInstance(t, ns, id, release)
		// An earlier run left the Lease released: the instances acquire it
		// at once rather than wait a lease duration before creating it.
		l := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: id, Labels: map[string]string{v1alpha1.LabelRing: ns}},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity: ptr.To(""), LeaseDurationSeconds: ptr.To(int32(restartLease / time.Second)),
				RenewTime: ptr.To(metav1.NewMicroTime(time.Now())),
			},
		}
		g.Expect(env().Client.Create(context.Background(), l)).To(Succeed())
	}
	for _, s := range sc.instances {
		s.start()
	}
	sc.names = createConfigMaps(t, ns, "cm", 30*len(ids))
	sc.history = watchHistory(t, configMaps, ns, ns)
	// The live instances acknowledge their drains, as pkg/instance does.
	acknowledger(t, ns, ns, func(id string) bool { s, ok := sc.instances[id]; return ok && s.held() })
	reg := leasecontroller.NewRegistry()
	startSharderWith(t, env().Config, reg, assign.Options{}, withLeaseController(reg))
	g.Eventually(sc.settled, timeout, poll).Should(Succeed())
	g.Eventually(func(g Gomega) { // the sharder has counted the objects
		g.Expect(getRing(g, ns).Status.Members).To(HaveEach(HaveField("Objects", BeNumerically(">", 0))))
	}, timeout, poll).Should(Succeed())
	return sc
}

// settled succeeds when every instance holds its Lease and every object is
// on one of them, without a drain.
func (sc *restartScenario) settled(g Gomega) {
	for id, s := range sc.instances {
		g.Expect(s.held()).To(BeTrue(), "instance %s does not hold its Lease", id)
	}
	all := labelsOf(g, sc.ns)
	for _, name := range sc.names {
		l := all[name]
		id := l[v1alpha1.ShardLabel(sc.ns)]
		s, ok := sc.instances[id]
		g.Expect(ok && s.held()).To(BeTrue(), "%s is on %q, which is not a live instance", name, id)
		g.Expect(l).NotTo(HaveKey(v1alpha1.DrainLabel(sc.ns)), "%s is being drained", name)
	}
}

// moves returns the shard label changes of the scenario's objects at
// resourceVersions after since.
func (sc *restartScenario) moves(since int64) []string {
	var out []string
	for _, name := range sc.names {
		events := sc.history.of(name)
		for i := 1; i < len(events); i++ {
			if events[i].resourceVersion > since && events[i].shard != events[i-1].shard {
				out = append(out, fmt.Sprintf("%s: %q -> %q", name, events[i-1].shard, events[i].shard))
			}
		}
	}
	return out
}

// checkNoOverlap fails the test when an object was taken from an instance
// without a drain while one of its processes held its Lease: both would
// reconcile it.
func (sc *restartScenario) checkNoOverlap(t *testing.T) {
	t.Helper()
	for _, name := range sc.names {
		events := sc.history.of(name)
		slices.SortFunc(events, func(a, b labelEvent) int { return int(a.resourceVersion - b.resourceVersion) })
		for i := 1; i < len(events); i++ {
			prev, cur := events[i-1], events[i]
			if prev.shard == "" || cur.shard == prev.shard || prev.drain {
				continue // not taken from an instance, or a drain handed it over
			}
			if s, ok := sc.instances[prev.shard]; ok && s.holding(cur.resourceVersion) {
				t.Errorf("%s moved from %s to %q without a drain at resourceVersion %d, while %s held its Lease (spans %v)",
					name, prev.shard, cur.shard, cur.resourceVersion, prev.shard, s.spans)
			}
		}
	}
}

// TestRingRecoversFromRestarts stops every instance of a ring at once,
// gracefully or not, and brings them back: each gets its Lease and its
// objects back within the bound, without anybody deleting a Lease, and no
// object is moved off an instance while it holds its Lease.
func TestRingRecoversFromRestarts(t *testing.T) {
	for _, tc := range []struct {
		name    string
		ids     []string
		release leaseholder.Release
		// restartHold sets the ring's spec.restartHold; nil: the default.
		restartHold *time.Duration
		kill        bool
		// away is how long the instances are gone.
		away time.Duration
		// within bounds the time from their return until every instance
		// holds its Lease and every object is on a live instance.
		within time.Duration
		// noMoves: no object may change instances at all.
		noMoves bool
	}{
		{name: "one instance restarted gracefully", ids: []string{"a"}, release: leaseholder.ReleaseRestart,
			away: time.Second, within: quickRecovery, noMoves: true},
		{name: "one instance stopped for good and back", ids: []string{"a"}, release: leaseholder.ReleaseStop,
			away: time.Second, within: quickRecovery, noMoves: true},
		{name: "one instance restarted with the restart hold off", ids: []string{"a"}, release: leaseholder.ReleaseRestart,
			restartHold: ptr.To(time.Duration(0)), away: time.Second, within: quickRecovery, noMoves: true},
		{name: "three instances restarted gracefully at once", ids: []string{"a", "b", "c"}, release: leaseholder.ReleaseRestart,
			away: time.Second, within: quickRecovery, noMoves: true},
		// The rebalance after three instances came back drains objects
		// through the acknowledger's watch and the API server's round trips:
		// seconds more on a loaded machine (a fresh-clone run at load 10
		// had one drain still open after 11 s).
		{name: "three instances stopped for good at once and back", ids: []string{"a", "b", "c"}, release: leaseholder.ReleaseStop,
			away: time.Second, within: 2*restartLease + 10*time.Second},
		{name: "three instances killed and back after 2.5 lease durations", ids: []string{"a", "b", "c"}, kill: true,
			away: 5 * restartLease / 2, within: 2*restartLease + 10*time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g := NewWithT(t)
			sc := newRestartScenario(t, tc.release, func(spec *v1alpha1.ControllerRingSpec) {
				if tc.restartHold != nil {
					spec.RestartHold = &metav1.Duration{Duration: *tc.restartHold}
				}
			}, tc.ids...)
			before := currentRevision(t)

			var wg sync.WaitGroup
			for _, s := range sc.instances {
				wg.Go(func() {
					if tc.kill {
						s.kill()
					} else {
						s.stop()
					}
				})
			}
			wg.Wait()
			time.Sleep(tc.away) // the instances are away: nothing to wait for but time
			back := time.Now()
			for _, s := range sc.instances {
				s.start()
			}
			g.Eventually(sc.settled, tc.within, 50*time.Millisecond).Should(Succeed(),
				"the ring did not recover within %v of the instances' return", tc.within)
			t.Logf("recovered %v after the instances' return (bound %v); objects moved meanwhile: %d",
				time.Since(back).Round(time.Millisecond), tc.within, len(sc.moves(before)))
			sc.checkNoOverlap(t)
			if tc.noMoves {
				g.Expect(sc.moves(before)).To(BeEmpty(), "objects moved although their instances came back")
			}
		})
	}
}
