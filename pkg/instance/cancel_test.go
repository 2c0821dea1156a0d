package instance_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/sharder-dev/sharder/internal/fixture"
	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/instance"
	ringpkg "github.com/sharder-dev/sharder/pkg/ring"
)

// cancellation records how the first reconcile of an object by controller
// "a" ended: it waits for its context to be cancelled (at most a minute).
type cancellation struct {
	name    string
	entered chan struct{}
	done    chan struct{}
	at      atomic.Pointer[time.Time]
	cause   atomic.Pointer[error]
	taken   atomic.Bool
}

func newCancellation(name string) *cancellation {
	return &cancellation{name: name, entered: make(chan struct{}), done: make(chan struct{})}
}

func (c *cancellation) hook(ctx context.Context, controller string, req reconcile.Request) {
	if controller != "a" || req.Name != c.name || !c.taken.CompareAndSwap(false, true) {
		return
	}
	close(c.entered)
	defer close(c.done)
	select {
	case <-ctx.Done():
		now, cause := time.Now(), context.Cause(ctx)
		c.at.Store(&now)
		c.cause.Store(&cause)
	case <-time.After(time.Minute):
	}
}

// TestReconcileCancelledWhenObjectMoves plays a forced move: the sharder asks
// for an object back while a reconcile of it runs longer than the ring's
// drainTimeout, then relabels it to another instance without an
// acknowledgement. The running reconcile's context is cancelled at once.
func TestReconcileCancelledWhenObjectMoves(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	const ring, id = "cancel-move", "i1"
	rec := newRecorder()
	c := newCancellation("long")
	startInstance(t, instanceConfig{ring: ring, namespace: ns, id: id, rec: rec, hook: c.hook})

	cm := createConfigMap(t, ns, "long", map[string]string{v1alpha1.ShardLabel(ring): id})
	g.Eventually(c.entered, 20*time.Second).Should(BeClosed())
	patchLabels(g, cm, map[string]*string{v1alpha1.DrainLabel(ring): ptr.To("true")})
	g.Consistently(c.done, 500*time.Millisecond).ShouldNot(BeClosed(), "a drain request alone cancels nothing")

	// The drain times out: the sharder moves the object.
	moved := time.Now()
	patchLabels(g, cm, map[string]*string{v1alpha1.ShardLabel(ring): ptr.To("i2"), v1alpha1.DrainLabel(ring): nil})
	g.Eventually(c.done, 5*time.Second).Should(BeClosed(), "the reconcile's context is cancelled")
	g.Expect(c.at.Load()).NotTo(BeNil(), "ended by the cancellation")
	g.Expect(c.at.Load().Sub(moved)).To(BeNumerically("<", 5*time.Second))
	g.Expect(errors.Is(*c.cause.Load(), instance.ErrMoved)).To(BeTrue(), "cause: %v", *c.cause.Load())
	g.Eventually(func() int { return rec.lostOf(id, "long") }, 10*time.Second).Should(Equal(1))
}

// TestReconcileCancelledWhenLeaseLost checks that the reconciles running when
// the instance loses its Lease (here: the Lease is deleted) are cancelled,
// whatever OnLost does next.
func TestReconcileCancelledWhenLeaseLost(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	const ring, id = "cancel-lost", "i1"
	rec := newRecorder()
	c := newCancellation("busy")
	var lost atomic.Int32
	startInstance(t, instanceConfig{ring: ring, namespace: ns, id: id, rec: rec, hook: c.hook,
		onLost: func() { lost.Add(1) }, // carries on: the process does not exit
	})
	createConfigMap(t, ns, "busy", map[string]string{v1alpha1.ShardLabel(ring): id})
	g.Eventually(c.entered, 20*time.Second).Should(BeClosed())

	held := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: id}}
	deleted := time.Now()
	g.Expect(env().Client.Delete(context.Background(), held)).To(Succeed())
	g.Eventually(c.done, 5*time.Second).Should(BeClosed(), "the reconcile's context is cancelled")
	g.Expect(c.at.Load()).NotTo(BeNil(), "ended by the cancellation")
	g.Expect(c.at.Load().Sub(deleted)).To(BeNumerically("<", 5*time.Second))
	g.Expect(errors.Is(*c.cause.Load(), instance.ErrLeaseLost)).To(BeTrue(), "cause: %v", *c.cause.Load())
	g.Expect(lost.Load()).To(BeEquivalentTo(1))
}

// TestForcedMoveCancelsBeforeTheNextInstanceStarts runs the sharder: an
// instance's reconcile of an object runs longer than the ring's
// drainTimeout, so it cannot acknowledge the drain when a new instance
// joins, and the sharder forces the move. The reconcile's context is
// cancelled before the next instance starts on the object: the sharder
// releases the object first and assigns it only after a grace.
func TestForcedMoveCancelsBeforeTheNextInstanceStarts(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	ring := ns
	startSharder(t)
	createRing(t, ns, 2*time.Second)

	// An object that i2 takes over from i1 when it joins.
	name := nameMovingTo(t, ns, "i2", "i1", "i2")

	rec := newRecorder()
	c := newCancellation(name)
	startInstance(t, instanceConfig{ring: ring, namespace: ns, id: "i1", rec: rec, hook: c.hook})
	createConfigMap(t, ns, name, nil)
	g.Eventually(c.entered, 30*time.Second).Should(BeClosed(), "i1 starts its long reconcile")

	startInstance(t, instanceConfig{ring: ring, namespace: ns, id: "i2", rec: rec})
	g.Eventually(c.done, 30*time.Second).Should(BeClosed(), "i1's reconcile ends")
	g.Expect(c.at.Load()).NotTo(BeNil(), "ended by the cancellation")
	g.Expect(errors.Is(*c.cause.Load(), instance.ErrMoved)).To(BeTrue(), "cause: %v", *c.cause.Load())
	first := firstRun(g, rec, name, "i2")
	g.Expect(c.at.Load().Before(first)).To(BeTrue(),
		"i1's reconcile was cancelled at %v, after i2 started at %v", c.at.Load().Format(time.StampMicro), first.Format(time.StampMicro))
	g.Expect(rec.overlaps()).To(BeEmpty())
}

// firstRun waits until instance id has reconciled object name and returns
// when its first reconcile of it started.
func firstRun(g Gomega, rec *recorder, name, id string) time.Time {
	var first time.Time
	g.Eventually(func() bool {
		runs := rec.runsOf(name, id)
		if len(runs) == 0 {
			return false
		}
		first = runs[0].start
		return true
	}, 30*time.Second).Should(BeTrue(), "%s reconciles the object", id)
	return first
}

// nameMovingTo returns the name of a ConfigMap of ns that a ring of ids (the
// default weight each) assigns to the instance to.
func nameMovingTo(t *testing.T, ns, to string, ids ...string) string {
	t.Helper()
	members := make([]ringpkg.Member, 0, len(ids))
	for _, id := range ids {
		members = append(members, ringpkg.Member{ID: id, VirtualNodes: v1alpha1.DefaultVirtualNodes})
	}
	rg, err := ringpkg.New(ringpkg.ConsistentHash, members)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		candidate := fmt.Sprintf("long-%d", i)
		if id, _ := rg.Lookup(ringpkg.ObjectKey("", "ConfigMap", ns, candidate)); id == to {
			return candidate
		}
	}
}

// ignoring is a reconcile of one object by controller "a" that ignores its
// context: it runs until the test "ends its process" (kill), as a reconcile
// blocked in a call that takes no context would.
type ignoring struct {
	name    string
	entered chan struct{}
	killed  chan struct{}
	taken   atomic.Bool
	killAt  atomic.Pointer[time.Time]
}

func newIgnoring(name string) *ignoring {
	return &ignoring{name: name, entered: make(chan struct{}), killed: make(chan struct{})}
}

func (c *ignoring) hook(_ context.Context, controller string, req reconcile.Request) {
	if controller != "a" || req.Name != c.name || !c.taken.CompareAndSwap(false, true) {
		return
	}
	close(c.entered)
	select {
	case <-c.killed:
	case <-time.After(time.Minute):
	}
}

// kill is the instance's OnStopOverdue: the process ends, and with it the
// reconcile.
func (c *ignoring) kill(int) {
	now := time.Now()
	if c.killAt.CompareAndSwap(nil, &now) {
		close(c.killed)
	}
}

// TestReconcileIgnoringItsContextEndsBeforeTheNextInstanceStarts runs the
// sharder and forces a move of an object whose reconcile ignores its
// cancelled context: the instance's bound on stopping ends its process
// (OnStopOverdue) StopTimeout after the cancellation, and the sharder,
// which reads that bound on the Lease (sharder.dev/max-stop), assigns the
// object to the next instance only after it: the two never reconcile the
// object at once.
func TestReconcileIgnoringItsContextEndsBeforeTheNextInstanceStarts(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	ring := ns
	startSharder(t)
	createRing(t, ns, 2*time.Second)
	name := nameMovingTo(t, ns, "i2", "i1", "i2")

	rec := newRecorder()
	c := newIgnoring(name)
	// Longer than the force grace and the watch lag together (2s each), so
	// that the sharder's wait for the bound is what keeps i2 off the object.
	const stop = 5 * time.Second
	startInstance(t, instanceConfig{ring: ring, namespace: ns, id: "i1", rec: rec, hook: c.hook, stopTimeout: stop, onStopOverdue: c.kill})
	g.Eventually(fixture.GetLease(env().Client, ns, "i1"), 20*time.Second).Should(
		HaveField("Annotations", HaveKeyWithValue(v1alpha1.AnnotationMaxStop, stop.String())), "the promise is on the Lease")
	createConfigMap(t, ns, name, nil)
	g.Eventually(c.entered, 30*time.Second).Should(BeClosed(), "i1 starts its reconcile")

	startInstance(t, instanceConfig{ring: ring, namespace: ns, id: "i2", rec: rec})
	g.Eventually(c.killed, 60*time.Second).Should(BeClosed(), "i1's process ends: its reconcile ignored the cancellation past its stop timeout")
	first := firstRun(g, rec, name, "i2")
	g.Expect(c.killAt.Load().Before(first)).To(BeTrue(),
		"i1's process ended at %v, after i2 started at %v", c.killAt.Load().Format(time.StampMicro), first.Format(time.StampMicro))
	g.Expect(rec.overlaps()).To(BeEmpty())
}

// TestLostLeaseEndsAReconcileIgnoringItsContext: when the instance loses
// its Lease while a reconcile that ignores its context runs, the instance
// ends its process (OnStopOverdue) StopTimeout after the cancellation, not
// before, and not when its reconciles return in time.
func TestLostLeaseEndsAReconcileIgnoringItsContext(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	const ring, id = "stop-lost", "i1"
	const stop = 2 * time.Second
	c := newIgnoring("stuck")
	var overdue atomic.Int32
	startInstance(t, instanceConfig{ring: ring, namespace: ns, id: id, rec: newRecorder(), hook: c.hook, stopTimeout: stop,
		onStopOverdue: func(running int) {
			overdue.Add(1)
			if running != 1 {
				t.Errorf("%d reconciles overdue, want 1", running)
			}
			c.kill(running)
		},
		onLost: func() {},
	})
	createConfigMap(t, ns, "stuck", map[string]string{v1alpha1.ShardLabel(ring): id})
	createConfigMap(t, ns, "prompt", map[string]string{v1alpha1.ShardLabel(ring): id})
	g.Eventually(c.entered, 20*time.Second).Should(BeClosed())

	deleted := time.Now()
	g.Expect(env().Client.Delete(context.Background(), &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: id}})).To(Succeed())
	g.Eventually(c.killed, 10*time.Second).Should(BeClosed(), "the process ends")
	g.Expect(c.killAt.Load().Sub(deleted)).To(BeNumerically(">=", stop), "not before the stop timeout")
	g.Consistently(overdue.Load, time.Second).Should(BeEquivalentTo(1))
}
