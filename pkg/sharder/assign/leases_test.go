package assign_test

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/internal/fixture"
	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/instance/leaseholder"
	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/sharder/assign"
	"github.com/sharder-dev/sharder/pkg/sharder/leasecontroller"
)

func createLease(t *testing.T, ns, id string) *coordinationv1.Lease {
	t.Helper()
	l := fixture.InstanceLease(ns, ns, id, time.Now(), time.Hour)
	if err := env().Client.Create(context.Background(), l); err != nil {
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
	ns := env().Namespace(t)
	newRing(t, ns, nil)
	createLease(t, ns, "a")
	b := createLease(t, ns, "b")
	names := createConfigMaps(t, ns, "cm", 20)
	reg := leasecontroller.NewRegistry()
	startSharderWith(t, env().Config, reg, assign.Options{}, withLeaseController(reg))

	both := []string{"a", "b"}
	g.Eventually(assigned(ns, names, placed(t, ns, both...)), timeout, poll).Should(Succeed())

	// Instance b shuts down and releases its Lease: its objects go to a.
	h := watchHistory(t, configMaps, ns, ns)
	g.Expect(env().Client.Get(ctx, client.ObjectKeyFromObject(b), b)).To(Succeed())
	b.Spec.HolderIdentity = nil
	g.Expect(env().Client.Update(ctx, b)).To(Succeed())
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

// renewing keeps the Lease of instance id renewed every interval, as a
// running instance does, until the returned function is called; that
// function returns the renewTime of the last renewal that was written.
func renewing(t *testing.T, ns, id string, interval time.Duration) (stop func() time.Time) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan time.Time, 1)
	go func() {
		var last time.Time
		defer func() { done <- last }()
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			l := &coordinationv1.Lease{}
			if err := env().Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: id}, l); err == nil {
				now := metav1.NewMicroTime(time.Now())
				l.Spec.RenewTime = &now
				if env().Client.Update(ctx, l) == nil {
					last = now.Time
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	var last time.Time
	stopped := false
	stop = func() time.Time {
		if !stopped {
			stopped = true
			cancel()
			last = <-done
		}
		return last
	}
	t.Cleanup(func() { stop() })
	return stop
}

// TestVanishedInstanceHoldsItsObjects checks that an instance whose Lease
// disappears from the ring without being released or taken is not taken for
// dead: its objects stay where they are, without a drain, until twice its
// lease duration has passed since its last renewal, and only then move.
// The Lease disappears by deletion (kubectl delete lease, or garbage
// collection after kubectl delete pod --force) or by losing its ring label.
func TestVanishedInstanceHoldsItsObjects(t *testing.T) {
	const leaseSeconds = 2
	for name, vanish := range map[string]func(g Gomega, l *coordinationv1.Lease){
		"deleted": func(g Gomega, l *coordinationv1.Lease) {
			g.Expect(env().Client.Delete(context.Background(), l)).To(Succeed())
		},
		"ring label removed": func(g Gomega, l *coordinationv1.Lease) {
			g.Expect(env().Client.Get(context.Background(), client.ObjectKeyFromObject(l), l)).To(Succeed())
			delete(l.Labels, v1alpha1.LabelRing)
			g.Expect(env().Client.Update(context.Background(), l)).To(Succeed())
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			g := NewWithT(t)
			ns := env().Namespace(t)
			newRing(t, ns, nil)
			createLease(t, ns, "a")
			b := createLease(t, ns, "b")
			b.Spec.LeaseDurationSeconds = ptr.To[int32](leaseSeconds)
			g.Expect(env().Client.Update(context.Background(), b)).To(Succeed())
			stopRenewing := renewing(t, ns, "b", 300*time.Millisecond)
			names := createConfigMaps(t, ns, "cm", 30)
			reg := leasecontroller.NewRegistry()
			startSharderWith(t, env().Config, reg, assign.Options{}, withLeaseController(reg))
			both := []string{"a", "b"}
			var onB []string
			g.Eventually(func(g Gomega) {
				got := labelsOf(g, ns)
				onB = onB[:0]
				for _, name := range names {
					want := expected(t, both, ns, name)
					g.Expect(got[name]).To(HaveKeyWithValue(v1alpha1.ShardLabel(ns), want))
					if want == "b" {
						onB = append(onB, name)
					}
				}
			}, timeout, poll).Should(Succeed())
			g.Expect(onB).NotTo(BeEmpty())

			// b is still running, but its Lease vanishes from the ring.
			h := watchHistory(t, configMaps, ns, ns)
			lastRenewal := stopRenewing()
			vanish(g, b)
			heldUntil := lastRenewal.Add(2 * leaseSeconds * time.Second)

			g.Eventually(func(g Gomega) {
				for _, l := range labelsOf(g, ns) {
					g.Expect(l).To(HaveKeyWithValue(v1alpha1.ShardLabel(ns), "a"))
				}
			}, timeout, poll).Should(Succeed())
			for _, name := range onB {
				g.Expect(h.drained(name)).To(BeFalse(), "%s was drained from an instance that is gone", name)
				for _, e := range h.of(name) {
					if e.shard == "a" {
						g.Expect(e.at).NotTo(BeTemporally("<", heldUntil),
							"%s moved %v before b was proven gone (last renewal %v + 2 × %ds)", name, heldUntil.Sub(e.at), lastRenewal, leaseSeconds)
					}
				}
			}
		})
	}
}

// slowPatches returns a copy of cfg whose PATCH requests each take at least
// delay longer.
func slowPatches(cfg *rest.Config, delay time.Duration) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
			if req.Method == http.MethodPatch {
				time.Sleep(delay)
			}
			return rt.RoundTrip(req)
		})
	})
	return cfg
}

// TestReleasedInstanceComesBackAfterItsObjectsMoved checks that an instance
// that released its Lease on shutdown and restarts with the same ID (a pod
// of a StatefulSet) cannot acquire its Lease again while the sharder is
// still relabelling its objects, even when that takes many lease durations:
// it would start on objects that are being moved to other instances.
func TestReleasedInstanceComesBackAfterItsObjectsMoved(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := env().Namespace(t)
	newRing(t, ns, nil)
	createLease(t, ns, "a")
	b := createLease(t, ns, "b")
	names := createConfigMaps(t, ns, "cm", 120)
	reg := leasecontroller.NewRegistry()
	// One worker and 40 ms per write: moving b's ~60 objects takes about
	// 2.5 s, more than twice b's one-second lease duration.
	startSharderWith(t, slowPatches(env().Config, 40*time.Millisecond), reg, assign.Options{Workers: 1}, withLeaseController(reg))
	both := []string{"a", "b"}
	g.Eventually(assigned(ns, names, placed(t, ns, both...)), timeout, poll).Should(Succeed())
	g.Eventually(func(g Gomega) { // the sharder has counted b's objects
		g.Expect(getRing(g, ns).Status.Members).To(ContainElement(HaveField("Objects", BeNumerically(">", 0))))
	}, timeout, poll).Should(Succeed())

	// b shuts down gracefully: it releases its one-second Lease.
	g.Expect(env().Client.Get(ctx, client.ObjectKeyFromObject(b), b)).To(Succeed())
	b.Spec.HolderIdentity = nil
	b.Spec.LeaseDurationSeconds = ptr.To[int32](1)
	b.Spec.RenewTime = ptr.To(metav1.NewMicroTime(time.Now()))
	g.Expect(env().Client.Update(ctx, b)).To(Succeed())

	// b restarts at once and acquires its Lease as soon as the holder rules
	// allow: a Lease nobody renewed within its duration.
	g.Eventually(func(g Gomega) {
		l := &coordinationv1.Lease{}
		g.Expect(env().Client.Get(ctx, client.ObjectKeyFromObject(b), l)).To(Succeed())
		now := time.Now()
		expires := membership.ReferenceTime(l).Add(membership.DurationOf(l))
		g.Expect(now.Before(expires)).To(BeFalse(), "held by %q until %v", ptr.Deref(l.Spec.HolderIdentity, ""), expires)
		l.Spec.HolderIdentity = ptr.To("b")
		l.Spec.AcquireTime = ptr.To(metav1.NewMicroTime(now))
		l.Spec.RenewTime = ptr.To(metav1.NewMicroTime(now))
		g.Expect(env().Client.Update(ctx, l)).To(Succeed())
	}, timeout, 20*time.Millisecond).Should(Succeed())

	// The moment it holds its Lease, no object may still carry its label.
	for name, l := range labelsOf(g, ns) {
		g.Expect(l).NotTo(HaveKeyWithValue(v1alpha1.ShardLabel(ns), "b"), "%s is still on b when b is back", name)
	}
}

// withLeaseController returns a setup for startSharderWith that adds the
// lease controller, publishing into reg.
func withLeaseController(reg *leasecontroller.Registry) func(ctrl.Manager) error {
	return func(mgr ctrl.Manager) error {
		c, err := leasecontroller.New(leasecontroller.Options{Registry: reg})
		if err != nil {
			return err
		}
		return c.SetupWithManager(mgr)
	}
}

// TestHoldOutlastsMovesInFlight: the sharder holds a dead instance's Lease
// while it moves the instance's objects, and releases it when no move can
// happen any more (here: the last ready instance went away too). An
// instance acquires a released Lease at once, so the release must wait for
// the moves already sent: a move decided under the hold that lands after
// the instance took its Lease back would pull an object from under a
// running instance without a drain.
func TestHoldOutlastsMovesInFlight(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := env().Namespace(t)
	newRing(t, ns, nil)
	a := createLease(t, ns, "a")
	c := createLease(t, ns, "c")
	names := createConfigMaps(t, ns, "cm", 20)
	reg := leasecontroller.NewRegistry()
	gt := newGate(func(req *http.Request) bool {
		return req.Method == http.MethodPatch && strings.Contains(req.URL.Path, "/namespaces/"+ns+"/configmaps/")
	})
	armed := atomic.Bool{}
	pick := gt.pick
	gt.pick = func(req *http.Request) bool { return armed.Load() && pick(req) }
	writeTimeout := 10 * time.Second
	startSharderWith(t, gt.config(env().Config), reg, assign.Options{WriteTimeout: writeTimeout}, withLeaseController(reg))
	opened := false
	openGate := func() {
		if !opened {
			opened = true
			close(gt.open)
		}
	}
	t.Cleanup(openGate) // before the sharder stops: a held write would keep it
	both := []string{"a", "c"}
	g.Eventually(assigned(ns, names, placed(t, ns, both...)), timeout, poll).Should(Succeed())
	g.Eventually(func(g Gomega) { // the sharder has counted a's objects
		g.Expect(getRing(g, ns).Status.Members).To(ContainElement(SatisfyAll(
			HaveField("Name", "a"), HaveField("Objects", BeNumerically(">", 0)))))
	}, timeout, poll).Should(Succeed())

	release := func(l *coordinationv1.Lease) {
		g.Expect(env().Client.Get(ctx, client.ObjectKeyFromObject(l), l)).To(Succeed())
		l.Spec.HolderIdentity = nil
		l.Spec.RenewTime = ptr.To(metav1.NewMicroTime(time.Now()))
		g.Expect(env().Client.Update(ctx, l)).To(Succeed())
	}
	holder := func() string {
		l := &coordinationv1.Lease{}
		g.Expect(env().Client.Get(ctx, client.ObjectKeyFromObject(a), l)).To(Succeed())
		return ptr.Deref(l.Spec.HolderIdentity, "")
	}

	// a shuts down: the sharder holds its Lease and moves its objects to c;
	// the first move waits in the gate.
	armed.Store(true)
	release(a)
	g.Eventually(gt.held, timeout).Should(BeClosed())
	g.Expect(holder()).To(HavePrefix(membership.SharderHolderPrefix))

	// c shuts down too: no instance is ready, so nothing moves any more and
	// the hold of a's Lease ends, but not while the move sent under it may
	// still land.
	release(c)
	g.Eventually(func(g Gomega) {
		r := getRing(g, ns)
		g.Expect(r.Status.AvailableInstances).To(BeEquivalentTo(0))
	}, timeout, poll).Should(Succeed())
	g.Consistently(holder, 2*time.Second, poll).Should(HavePrefix(membership.SharderHolderPrefix),
		"a's Lease was released while a move of its objects was in flight")
	openGate()
	g.Eventually(gt.answer, timeout).Should(Receive())
	g.Eventually(holder, timeout, poll).Should(BeEmpty(), "a's Lease is released once the move returned")
}

// TestDeletedLeaseInstanceComesBackWhileItsObjectsMove: an instance whose
// Lease is deleted with its process (a force-deleted pod whose Lease the
// garbage collector removes, or kubectl delete lease of a crashed
// instance) comes back, with the real Lease holder, while its objects are
// being moved away. The sharder moves them only after it created the Lease
// and holds it, so the returning process finds its Lease held and waits:
// the moment it holds its Lease, no object carries its label any more.
func TestDeletedLeaseInstanceComesBackWhileItsObjectsMove(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := env().Namespace(t)
	newRing(t, ns, nil)
	createLease(t, ns, "a")
	b := createLease(t, ns, "b")
	b.Spec.LeaseDurationSeconds = ptr.To[int32](1)
	g.Expect(env().Client.Update(ctx, b)).To(Succeed())
	stopRenewing := renewing(t, ns, "b", 200*time.Millisecond)
	names := createConfigMaps(t, ns, "cm", 120)
	reg := leasecontroller.NewRegistry()
	// One worker and 40 ms per write: moving b's ~60 objects takes about
	// 2.5 s, more than twice b's one-second lease duration.
	startSharderWith(t, slowPatches(env().Config, 40*time.Millisecond), reg, assign.Options{Workers: 1}, withLeaseController(reg))
	both := []string{"a", "b"}
	g.Eventually(assigned(ns, names, placed(t, ns, both...)), timeout, poll).Should(Succeed())
	g.Eventually(func(g Gomega) { // the sharder has counted b's objects
		g.Expect(getRing(g, ns).Status.Members).To(ContainElement(HaveField("Objects", BeNumerically(">", 0))))
	}, timeout, poll).Should(Succeed())

	initial := 0
	for _, l := range labelsOf(g, ns) {
		if l[v1alpha1.ShardLabel(ns)] == "b" {
			initial++
		}
	}

	// Every write to b's Lease and to the objects from now on, with the
	// resourceVersions etcd gave them (one etcd: one order).
	hist := recordHistory(t, ns)

	// b crashes and its Lease is deleted with it.
	stopRenewing()
	g.Expect(env().Client.Delete(ctx, b)).To(Succeed())

	// b's replacement starts once the first of its objects has moved: the
	// sharder is moving them.
	g.Eventually(func(g Gomega) {
		onB := 0
		for _, l := range labelsOf(g, ns) {
			if l[v1alpha1.ShardLabel(ns)] == "b" {
				onB++
			}
		}
		g.Expect(onB).To(BeNumerically(">", 0))
		g.Expect(onB).To(BeNumerically("<", initial))
	}, timeout, 10*time.Millisecond).Should(Succeed())
	holder, err := leaseholder.NewHolder(env().Client, leaseholder.Options{
		Ring: ns, Namespace: ns, Identity: "b", LeaseDuration: time.Second,
	})
	g.Expect(err).NotTo(HaveOccurred())
	hctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = holder.Start(hctx) // the holder ends with the test: its result is not the test's
	}()
	t.Cleanup(func() { cancel(); <-done })
	g.Eventually(holder.Held, 30*time.Second, 5*time.Millisecond).Should(BeTrue())

	// From the write by which b holds its Lease again on, no object leaves b
	// without a drain: every move away from it landed before. (Whether any
	// object is still on b then depends on whether the sharder's hold
	// outlasted the moves or lapsed, which b may take over; either is
	// safe.) The moves the sharder sent land within its write timeout.
	var acquired uint64
	g.Eventually(func() (ok bool) {
		acquired, ok = hist.acquired("b")
		return ok
	}, 10*time.Second, poll).Should(BeTrue(), func() string {
		return "the history shows b acquire its Lease after the sharder held it: " + hist.leaseWrites("b")
	})
	g.Consistently(func(g Gomega) {
		for _, m := range hist.movesFrom("b") {
			g.Expect(m.rv).To(BeNumerically("<", acquired),
				"%s moved from b to %q without a drain at resourceVersion %d, after b acquired its Lease at %d; b's Lease: %s", m.name, m.to, m.rv, acquired, hist.leaseWrites("b"))
		}
	}, 3*time.Second, 100*time.Millisecond).Should(Succeed())
}

// leaseHistory records the writes to a namespace's Leases and ConfigMaps as a
// watch delivers them.
type leaseHistory struct {
	mu     sync.Mutex
	ring   string
	leases []historyLeaseWrite
	moves  []historyMove
	labels map[string]map[string]string // ConfigMap -> labels last seen
}

type historyLeaseWrite struct {
	name, holder string
	rv           uint64
}

type historyMove struct {
	name, from, to string
	rv             uint64
}

// recordHistory watches ns's Leases and ConfigMaps (the ring is named ns)
// until the test ends.
func recordHistory(t *testing.T, ns string) *leaseHistory {
	t.Helper()
	wc, err := client.NewWithWatch(env().Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	h := &leaseHistory{ring: ns, labels: map[string]map[string]string{}}
	leases, err := wc.Watch(ctx, &coordinationv1.LeaseList{}, client.InNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	objects, err := wc.Watch(ctx, &corev1.ConfigMapList{}, client.InNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for ev := range leases.ResultChan() {
			if l, ok := ev.Object.(*coordinationv1.Lease); ok {
				rv, _ := strconv.ParseUint(l.ResourceVersion, 10, 64)
				h.mu.Lock()
				h.leases = append(h.leases, historyLeaseWrite{name: l.Name, holder: ptr.Deref(l.Spec.HolderIdentity, ""), rv: rv})
				h.mu.Unlock()
			}
		}
	}()
	go func() {
		for ev := range objects.ResultChan() {
			cm, ok := ev.Object.(*corev1.ConfigMap)
			if !ok {
				continue
			}
			rv, _ := strconv.ParseUint(cm.ResourceVersion, 10, 64)
			h.mu.Lock()
			before, seen := h.labels[cm.Name]
			from, to := before[v1alpha1.ShardLabel(ns)], cm.Labels[v1alpha1.ShardLabel(ns)]
			_, drained := before[v1alpha1.DrainLabel(ns)]
			if seen && from != "" && to != from && !drained {
				h.moves = append(h.moves, historyMove{name: cm.Name, from: from, to: to, rv: rv})
			}
			h.labels[cm.Name] = cm.Labels
			h.mu.Unlock()
		}
	}()
	return h
}

// acquired returns the resourceVersion of the first write that shows id
// holding its own Lease after a write that showed another holder (or
// none): the acquisition after the sharder's hold.
func (h *leaseHistory) acquired(id string) (uint64, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	other := false
	for _, l := range h.leases {
		switch {
		case l.name != id:
		case l.holder != id:
			other = true
		case other:
			return l.rv, true
		}
	}
	return 0, false
}

// leaseWrites describes the writes to id's Lease.
func (h *leaseHistory) leaseWrites(id string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, l := range h.leases {
		if l.name == id {
			out = append(out, fmt.Sprintf("%d:%q", l.rv, l.holder))
		}
	}
	return strings.Join(out, " ")
}

// movesFrom returns the moves away from instance id without a drain.
func (h *leaseHistory) movesFrom(id string) []historyMove {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []historyMove
	for _, m := range h.moves {
		if m.from == id {
			out = append(out, m)
		}
	}
	return out
}
