package leaseholder_test

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/sharder-dev/sharder/internal/fixture"
	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/instance/leaseholder"
	"github.com/sharder-dev/sharder/pkg/membership"
)

// holderRing is the ring label of the holder tests' Leases.
const holderRing = "holder-test"

// running is a started holder.
type running struct {
	*leaseholder.Holder
	cancel context.CancelFunc
	done   chan error
	lost   atomic.Int32
	lostAt atomic.Pointer[time.Time]
	// held is when the test first saw Held() true (polled every 10ms).
	held atomic.Pointer[time.Time]
}

// acquiredAt returns when Held was first seen true: at most 10ms after the
// acquisition. Called once Held is true, it waits for the watcher below to
// have recorded it (zero if it never does).
func (r *running) acquiredAt() time.Time {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if at := r.held.Load(); at != nil {
			return *at
		}
	}
	return time.Time{}
}

// startHolder starts a holder and stops it at the end of the test.
func startHolder(t *testing.T, opts leaseholder.Options) *running {
	t.Helper()
	return startHolderOn(t, env().Client, opts)
}

// startHolderOn starts a holder writing with c.
func startHolderOn(t *testing.T, c client.Client, opts leaseholder.Options) *running {
	t.Helper()
	r := &running{done: make(chan error, 1)}
	if opts.OnLost == nil {
		opts.OnLost = func() {
			now := time.Now()
			r.lostAt.Store(&now)
			r.lost.Add(1)
		}
	}
	h, err := leaseholder.NewHolder(c, opts)
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	r.Holder = h
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- h.Start(ctx) }()
	go func() {
		for ctx.Err() == nil && !h.Held() {
			time.Sleep(10 * time.Millisecond)
		}
		now := time.Now()
		r.held.Store(&now)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-r.done; err != nil && !errors.Is(err, leaseholder.ErrLeaseLost) {
			t.Errorf("holder: %v", err)
		}
	})
	return r
}

// TestHolderCreatesAndRenews checks the Lease the holder writes.
func TestHolderCreatesAndRenews(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ns := env().Namespace(t)
	pod := &metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: "pod-0", UID: types.UID("uid-new")}
	r := startHolder(t, leaseholder.Options{
		Ring: holderRing, Namespace: ns, Identity: "pod-0", VirtualNodes: 50,
		LeaseDuration: 2 * time.Second, RenewPeriod: 200 * time.Millisecond, Pod: pod,
	})
	g.Eventually(r.Held).Should(BeTrue())
	first, err := getLease(ns, "pod-0")()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(first.Labels).To(Equal(map[string]string{v1alpha1.LabelRing: holderRing, v1alpha1.LabelVirtualNodes: "50"}))
	g.Expect(first.OwnerReferences).To(Equal([]metav1.OwnerReference{*pod}))
	g.Expect(first.Spec.HolderIdentity).To(HaveValue(Equal("pod-0")))
	g.Expect(first.Spec.LeaseDurationSeconds).To(HaveValue(BeEquivalentTo(2)))
	g.Expect(first.Spec.AcquireTime).NotTo(BeNil())
	state, _ := membership.StateOf(first, time.Now())
	g.Expect(state).To(Equal(membership.StateReady))

	g.Eventually(getLease(ns, "pod-0")).Should(HaveField("Spec.RenewTime.Time", BeTemporally(">", first.Spec.RenewTime.Time)))
	renewed, err := getLease(ns, "pod-0")()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(renewed.Spec.AcquireTime.Time).To(BeTemporally("==", first.Spec.AcquireTime.Time), "a renewal keeps the acquire time")
	g.Expect(r.lost.Load()).To(BeZero())
}

// TestHolderReacquiresReleasedLease checks that a holder takes over a
// released Lease and replaces what a former holder left: a stale Pod owner
// and a weight it no longer asks for.
func TestHolderReacquiresReleasedLease(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ns := env().Namespace(t)
	other := metav1.OwnerReference{APIVersion: "example.dev/v1", Kind: "Thing", Name: "x", UID: "uid-x"}
	// Released more than its duration ago.
	createLease(t, holderRing, ns, "pod-1", time.Now().Add(-61*time.Second), 60, func(l *coordinationv1.Lease) {
		l.Spec.HolderIdentity = ptr.To("")
		l.Labels[v1alpha1.LabelVirtualNodes] = "10"
		l.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "pod-1", UID: "uid-old"}, other}
	})
	pod := &metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: "pod-1", UID: "uid-new"}
	r := startHolder(t, leaseholder.Options{Ring: holderRing, Namespace: ns, Identity: "pod-1", LeaseDuration: 2 * time.Second, Pod: pod})
	g.Eventually(r.Held).Should(BeTrue())
	got, err := getLease(ns, "pod-1")()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got.Spec.HolderIdentity).To(HaveValue(Equal("pod-1")))
	g.Expect(got.Labels).NotTo(HaveKey(v1alpha1.LabelVirtualNodes))
	g.Expect(got.OwnerReferences).To(ConsistOf(*pod, other))
}

// TestHolderAcquiresReleasedLeaseAtOnce checks that a Lease released
// moments ago (the previous process of a restarted instance) is taken back
// at once: the sharder moves an instance's objects only while it holds the
// instance's Lease, so a released Lease is nobody's.
func TestHolderAcquiresReleasedLeaseAtOnce(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ns := env().Namespace(t)
	createLease(t, holderRing, ns, "pod-6", time.Now(), 60, func(l *coordinationv1.Lease) {
		l.Spec.HolderIdentity = ptr.To("")
	})
	started := time.Now()
	r := startHolder(t, leaseholder.Options{Ring: holderRing, Namespace: ns, Identity: "pod-6", LeaseDuration: 60 * time.Second})
	g.Eventually(r.Held).Should(BeTrue())
	g.Expect(time.Since(started)).To(BeNumerically("<", 10*time.Second), "acquired without waiting out the 60s duration")
}

// TestHolderDropsFenceOnAcquire checks that an instance acquiring its Lease
// again after the sharder fenced it (took it, annotated sharder.dev/fenced)
// removes the annotation: the fence is over once the instance holds the
// Lease, and a fence left behind would make the sharder wait out a fence
// again when the instance next releases its Lease or loses it.
func TestHolderDropsFenceOnAcquire(t *testing.T) {
	t.Parallel()
	for name, holder := range map[string]string{
		"released by the sharder":        "",
		"the sharder's takeover expired": sharderIdentity,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			g := NewWithT(t)
			ns := env().Namespace(t)
			createLease(t, holderRing, ns, "pod-f", time.Now(), 1, func(l *coordinationv1.Lease) {
				l.Spec.HolderIdentity = ptr.To(holder)
				l.Annotations = map[string]string{v1alpha1.AnnotationFenced: "true"}
			})
			r := startHolder(t, leaseholder.Options{
				Ring: holderRing, Namespace: ns, Identity: "pod-f", LeaseDuration: 2 * time.Second, RenewPeriod: 100 * time.Millisecond,
			})
			g.Eventually(r.Held).Should(BeTrue())
			held := func() (*coordinationv1.Lease, error) { return getLease(ns, "pod-f")() }
			g.Eventually(held).Should(And(
				HaveField("Spec.HolderIdentity", HaveValue(Equal("pod-f"))),
				HaveField("Annotations", Not(HaveKey(v1alpha1.AnnotationFenced))),
			))
			g.Consistently(held).Should(HaveField("Annotations", Not(HaveKey(v1alpha1.AnnotationFenced))))
		})
	}
}

// holdLease keeps a Lease held by holder, renewing it every period with
// renewTime stamped by stamp, until the returned stop is called; stop
// returns when the last renewal landed.
func holdLease(t *testing.T, ns, id, holder string, period time.Duration, stamp func() time.Time) (stop func() time.Time) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	last := make(chan time.Time, 1)
	renew := func() error {
		return retryOnConflict(func() error {
			l := &coordinationv1.Lease{}
			if err := env().Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: id}, l); err != nil {
				return err
			}
			l.Spec.HolderIdentity = ptr.To(holder)
			l.Spec.RenewTime = ptr.To(metav1.NewMicroTime(stamp()))
			return env().Client.Update(ctx, l)
		})
	}
	if err := renew(); err != nil {
		t.Fatalf("holding Lease %s: %v", id, err)
	}
	go func() {
		at := time.Now()
		defer func() { last <- at }()
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(period):
			}
			if err := renew(); err == nil {
				at = time.Now()
			} else if ctx.Err() == nil {
				t.Errorf("renewing the hold of Lease %s: %v", id, err)
			}
		}
	}()
	var once sync.Once
	var at time.Time
	stop = func() time.Time {
		once.Do(func() { cancel(); at = <-last })
		return at
	}
	t.Cleanup(func() { stop() })
	return stop
}

func retryOnConflict(f func() error) error {
	for {
		if err := f(); !apierrors.IsConflict(err) {
			return err
		}
	}
}

// TestHolderWaitsOutSharderHold checks that a holder does not acquire a
// Lease the sharder holds while the sharder renews it, whatever the clocks
// say: neither a clock here that runs ahead nor a stamp the sharder wrote
// long ago lets it in. Once the renewals stop, it acquires the Lease after
// watching it unrenewed for its duration.
func TestHolderWaitsOutSharderHold(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		clock clock.Clock
		stamp func() time.Time
	}{
		"clock ahead by an hour": {clock: fixture.OffsetClock{Offset: time.Hour}, stamp: time.Now},
		"sharder's stamps an hour old": {clock: clock.RealClock{}, stamp: func() time.Time {
			return time.Now().Add(-time.Hour)
		}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			g := NewWithT(t)
			ns := env().Namespace(t)
			createLease(t, holderRing, ns, "pod-9", time.Now(), 2)
			stop := holdLease(t, ns, "pod-9", "sharder:test", 500*time.Millisecond, tc.stamp)
			r := startHolder(t, leaseholder.Options{
				Ring: holderRing, Namespace: ns, Identity: "pod-9", LeaseDuration: 2 * time.Second, RenewPeriod: 100 * time.Millisecond, Clock: tc.clock,
			})
			g.Consistently(r.Held, 4*time.Second, 50*time.Millisecond).Should(BeFalse(), "acquired a Lease the sharder renews")
			last := stop()
			g.Eventually(r.Held, 10*time.Second).Should(BeTrue())
			got, err := getLease(ns, "pod-9")()
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(got.Spec.HolderIdentity).To(HaveValue(Equal("pod-9")))
			// Acquired no sooner than the Lease's duration after its last
			// renewal landed (as timed here, by the test's clock).
			g.Expect(r.acquiredAt()).To(BeTemporally(">=", last.Add(2*time.Second-100*time.Millisecond)))
		})
	}
}

// TestHolderReleaseRestart checks the hand-back for a restart: the Lease
// loses its holder and gains the restarting annotation, and the next
// process with the same ID acquires it at once and drops the annotation.
func TestHolderReleaseRestart(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ns := env().Namespace(t)
	pod := &metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: "pod-10", UID: "uid-10"}
	opts := leaseholder.Options{Ring: holderRing, Namespace: ns, Identity: "pod-10", LeaseDuration: 60 * time.Second, Release: leaseholder.ReleaseRestart, Pod: pod}
	for _, id := range []string{"pod-10", "pod-11"} {
		createLease(t, holderRing, ns, id, time.Now(), 60, func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = ptr.To("") })
	}
	first := startHolder(t, opts)
	g.Eventually(first.Held).Should(BeTrue())
	first.cancel()
	g.Eventually(first.done, 10*time.Second).Should(Receive(BeNil()))
	first.done <- nil // for the cleanup
	released, err := getLease(ns, "pod-10")()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(released.Spec.HolderIdentity).To(HaveValue(BeEmpty()))
	g.Expect(released.Annotations).To(HaveKeyWithValue(v1alpha1.AnnotationRestarting, "true"))
	g.Expect(released.OwnerReferences).To(BeEmpty(), "garbage collection would delete the Lease with the old pod")

	started := time.Now()
	second := startHolder(t, opts)
	g.Eventually(second.Held).Should(BeTrue())
	g.Expect(time.Since(started)).To(BeNumerically("<", 10*time.Second), "acquired without waiting out the 60s duration")
	back, err := getLease(ns, "pod-10")()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(back.Spec.HolderIdentity).To(HaveValue(Equal("pod-10")))
	g.Expect(back.Annotations).NotTo(HaveKey(v1alpha1.AnnotationRestarting))
	g.Expect(back.OwnerReferences).To(ConsistOf(*pod))

	// Stopping for good hands it back without the annotation.
	opts.Identity, opts.Release = "pod-11", leaseholder.ReleaseStop
	opts.Pod = &metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: "pod-11", UID: "uid-11"}
	third := startHolder(t, opts)
	g.Eventually(third.Held).Should(BeTrue())
	third.cancel()
	g.Eventually(third.done, 10*time.Second).Should(Receive(BeNil()))
	third.done <- nil
	stopped, err := getLease(ns, "pod-11")()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(stopped.Spec.HolderIdentity).To(HaveValue(BeEmpty()))
	g.Expect(stopped.Annotations).NotTo(HaveKey(v1alpha1.AnnotationRestarting))
	g.Expect(stopped.OwnerReferences).To(ConsistOf(*opts.Pod), "a Lease released for good goes with its pod")
}

// TestHolderKeepsLeaseWhenNotIdle checks that a holder whose BeforeRelease
// reports work still in flight does not release the Lease: it is left to
// expire, so the sharder waits before moving the instance's objects.
func TestHolderKeepsLeaseWhenNotIdle(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ns := env().Namespace(t)
	r := startHolder(t, leaseholder.Options{
		Ring: holderRing, Namespace: ns, Identity: "pod-8", LeaseDuration: 2 * time.Second, RenewPeriod: 100 * time.Millisecond,
		BeforeRelease: func(context.Context) error { return errors.New("1 reconcile still in flight") },
	})
	g.Eventually(r.Held).Should(BeTrue())
	r.cancel()
	g.Eventually(r.done).Should(Receive(BeNil()))
	r.done <- nil // for the cleanup
	g.Expect(getLease(ns, "pod-8")()).To(HaveField("Spec.HolderIdentity", HaveValue(Equal("pod-8"))))
	g.Expect(r.Held()).To(BeFalse())
}

// TestHolderLostWhenDeleted checks that a Lease deleted while held counts as
// lost (the sharder treats an instance without a Lease as dead) rather than
// being quietly created again.
func TestHolderLostWhenDeleted(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ns := env().Namespace(t)
	r := startHolder(t, leaseholder.Options{Ring: holderRing, Namespace: ns, Identity: "pod-7", LeaseDuration: 2 * time.Second, RenewPeriod: 100 * time.Millisecond})
	g.Eventually(r.Held).Should(BeTrue())
	got, err := getLease(ns, "pod-7")()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(env().Client.Delete(context.Background(), got)).To(Succeed())
	var stopped error
	g.Eventually(r.done).Should(Receive(&stopped))
	g.Expect(errors.Is(stopped, leaseholder.ErrLeaseLost)).To(BeTrue(), "Start returned %v", stopped)
	g.Expect(r.lost.Load()).To(BeEquivalentTo(1))
	r.done <- stopped // for the cleanup
}

// TestHolderKeepsLeaseAcrossLabelPatches checks that the sharder's state
// label writes (which change the resourceVersion) do not cost the Lease.
func TestHolderKeepsLeaseAcrossLabelPatches(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ns := env().Namespace(t)
	// A renew deadline of 2s leaves room for a slow API server: the test is
	// about conflicts, not timing.
	r := startHolder(t, leaseholder.Options{Ring: holderRing, Namespace: ns, Identity: "pod-2", LeaseDuration: 3 * time.Second, RenewPeriod: 100 * time.Millisecond})
	g.Eventually(r.Held).Should(BeTrue())
	for i := range 10 {
		got, err := getLease(ns, "pod-2")()
		g.Expect(err).NotTo(HaveOccurred())
		patched := got.DeepCopy()
		patched.Labels[v1alpha1.LabelState] = []string{"ready", "expired"}[i%2]
		g.Expect(env().Client.Patch(context.Background(), patched, client.MergeFrom(got))).To(Succeed())
		// Wait for a renewal on top of the patch.
		g.Eventually(getLease(ns, "pod-2")).Should(HaveField("Spec.RenewTime.Time", BeTemporally(">", got.Spec.RenewTime.Time)))
	}
	g.Expect(r.Held()).To(BeTrue())
	g.Expect(r.lost.Load()).To(BeZero())
}

// TestHolderLostWhenTaken checks that a holder whose Lease was taken calls
// OnLost at once and does not release the new holder's Lease.
func TestHolderLostWhenTaken(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ns := env().Namespace(t)
	r := startHolder(t, leaseholder.Options{Ring: holderRing, Namespace: ns, Identity: "pod-3", LeaseDuration: 2 * time.Second, RenewPeriod: 100 * time.Millisecond})
	g.Eventually(r.Held).Should(BeTrue())

	got, err := getLease(ns, "pod-3")()
	g.Expect(err).NotTo(HaveOccurred())
	got.Spec.HolderIdentity = ptr.To(sharderIdentity)
	got.Spec.RenewTime = ptr.To(metav1.NowMicro())
	g.Expect(env().Client.Update(context.Background(), got)).To(Succeed())

	var err2 error
	g.Eventually(r.done).Should(Receive(&err2))
	g.Expect(errors.Is(err2, leaseholder.ErrLeaseLost)).To(BeTrue(), "Start returned %v", err2)
	g.Expect(r.lost.Load()).To(BeEquivalentTo(1))
	g.Expect(r.Held()).To(BeFalse())
	g.Expect(getLease(ns, "pod-3")()).To(HaveField("Spec.HolderIdentity", HaveValue(Equal(sharderIdentity))))
	r.done <- err2 // for the cleanup
}

// TestHolderLostWhenRenewalFails checks that a holder that cannot renew calls
// OnLost once its renew deadline has passed, before the sharder could take
// the Lease. TestHolderGivesUpAtRenewDeadline pins the instant on a fake
// clock.
func TestHolderLostWhenRenewalFails(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ns := env().Namespace(t)
	var failing atomic.Bool
	r := startHolder(t, leaseholder.Options{
		Ring: holderRing, Namespace: ns, Identity: "pod-4", LeaseDuration: 2 * time.Second, RenewPeriod: 400 * time.Millisecond,
		Check: func(context.Context) error {
			if failing.Load() {
				return errors.New("unhealthy")
			}
			return nil
		},
	})
	g.Eventually(r.Held).Should(BeTrue())
	failing.Store(true)
	g.Eventually(r.lost.Load, 5*time.Second).Should(BeEquivalentTo(1))
	g.Eventually(r.done).Should(Receive(MatchError(leaseholder.ErrLeaseLost)))
	r.done <- nil // for the cleanup

	last, err := getLease(ns, "pod-4")()
	g.Expect(err).NotTo(HaveOccurred())
	lostAt := *r.lostAt.Load()
	g.Expect(lostAt).To(BeTemporally(">=", last.Spec.RenewTime.Add(2*time.Second*2/3)), "not lost before the renew deadline")
	g.Expect(lostAt).To(BeTemporally("<", last.Spec.RenewTime.Add(4*time.Second)), "lost before the Lease could be taken")
	g.Expect(r.Held()).To(BeFalse())
}

// TestTwoProcessesClaimOneID checks that a second process with the same
// instance ID does not steal the live Lease: it waits until the first one
// releases it.
func TestTwoProcessesClaimOneID(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ns := env().Namespace(t)
	// 2 s Leases renewed every 200 ms: a loaded machine may answer a few
	// renewals late without the first holder losing its Lease.
	opts := leaseholder.Options{Ring: holderRing, Namespace: ns, Identity: "twin", LeaseDuration: 2 * time.Second, RenewPeriod: 200 * time.Millisecond}
	first := startHolder(t, opts)
	g.Eventually(first.Held).Should(BeTrue())
	second := startHolder(t, opts)

	// Two lease durations pass: the first keeps renewing, the second keeps
	// waiting, nobody loses.
	g.Consistently(second.Held, 4*time.Second, 50*time.Millisecond).Should(BeFalse())
	g.Expect(first.Held()).To(BeTrue())
	g.Expect(first.lost.Load()).To(BeZero())
	g.Expect(second.lost.Load()).To(BeZero())

	// The first releases: the second acquires.
	first.cancel()
	g.Eventually(first.done).Should(Receive(BeNil()))
	first.done <- nil // for the cleanup
	g.Eventually(second.Held, 5*time.Second).Should(BeTrue())
	g.Expect(getLease(ns, "twin")()).To(HaveField("Spec.HolderIdentity", HaveValue(Equal("twin"))))
	g.Consistently(second.lost.Load, 2*time.Second).Should(BeZero())
}

// TestHolderRenewsDuringBeforeRelease checks that the Lease stays held while
// BeforeRelease runs, even longer than the lease duration, and is released
// right after.
func TestHolderRenewsDuringBeforeRelease(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ns := env().Namespace(t)
	entered, finish := make(chan struct{}), make(chan struct{})
	var finishOnce sync.Once
	release := func() { finishOnce.Do(func() { close(finish) }) }
	r := startHolder(t, leaseholder.Options{
		// Renewals every 300 ms keep a 3 s Lease ready even when the API
		// server answers a few of them late on a loaded machine.
		Ring: holderRing, Namespace: ns, Identity: "pod-5", LeaseDuration: 3 * time.Second, RenewPeriod: 300 * time.Millisecond,
		BeforeRelease: func(context.Context) error {
			close(entered)
			<-finish
			return nil
		},
	})
	// A failing assertion below must not leave BeforeRelease blocked, or the
	// holder's cleanup would wait for it forever.
	t.Cleanup(release)
	g.Eventually(r.Held).Should(BeTrue())
	r.cancel()
	g.Eventually(entered).Should(BeClosed())
	g.Consistently(func() (membership.State, error) {
		got, err := getLease(ns, "pod-5")()
		if err != nil {
			return "", err
		}
		state, _ := membership.StateOf(got, time.Now())
		return state, nil
	}, 4*time.Second, 50*time.Millisecond).Should(Equal(membership.StateReady), "ready for longer than a lease duration")
	g.Expect(r.Held()).To(BeTrue())

	release()
	g.Eventually(r.done).Should(Receive(BeNil()))
	r.done <- nil // for the cleanup
	g.Expect(getLease(ns, "pod-5")()).To(HaveField("Spec.HolderIdentity", HaveValue(BeEmpty())))
	g.Expect(r.Held()).To(BeFalse())
	g.Expect(r.lost.Load()).To(BeZero())
}

// TestHolderKeepsLeaseAfterLostReply checks that a write which reached the API
// server but whose reply was lost (a timeout on this side) is recognised as
// the holder's own on the next attempt: the holder keeps the Lease instead
// of taking its own write for someone else's.
func TestHolderKeepsLeaseAfterLostReply(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ns := env().Namespace(t)

	var toLose, lost atomic.Int32 // replies still to lose, replies lost
	var lastLost atomic.Pointer[coordinationv1.LeaseSpec]
	loseReply := func(obj client.Object) error {
		for {
			n := toLose.Load()
			if n <= 0 {
				return nil
			}
			if toLose.CompareAndSwap(n, n-1) {
				lost.Add(1)
				lastLost.Store(obj.(*coordinationv1.Lease).Spec.DeepCopy())
				return apierrors.NewTimeoutError("the reply was lost on the way back", 1)
			}
		}
	}
	c := interceptor.NewClient(watchClient(t), interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if err := c.Create(ctx, obj, opts...); err != nil {
				return err
			}
			return loseReply(obj)
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			if err := c.Update(ctx, obj, opts...); err != nil {
				return err
			}
			return loseReply(obj)
		},
	})

	// The creation's reply is lost: the holder holds the Lease it created,
	// without waiting for it to expire and acquiring it anew.
	toLose.Store(1)
	r := startHolderOn(t, c, leaseholder.Options{
		Ring: holderRing, Namespace: ns, Identity: "lossy", LeaseDuration: 2 * time.Second, RenewPeriod: 100 * time.Millisecond,
	})
	g.Eventually(r.Held).Should(BeTrue())
	g.Expect(lost.Load()).To(BeEquivalentTo(1))
	created := lastLost.Load()
	got, err := getLease(ns, "lossy")()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got.Spec.AcquireTime.Time).To(BeTemporally("==", created.AcquireTime.Time), "the acquisition is the lost creation")

	// Three renewals in a row land with their replies lost.
	toLose.Store(3)
	g.Eventually(lost.Load).Should(BeEquivalentTo(4))
	renewedUnseen := lastLost.Load().RenewTime.Time
	g.Eventually(getLease(ns, "lossy")).Should(HaveField("Spec.RenewTime.Time", BeTemporally(">", renewedUnseen)), "renewed after the lost replies")
	g.Expect(r.Held()).To(BeTrue())
	g.Expect(r.lost.Load()).To(BeZero(), "OnLost not called")
	g.Expect(getLease(ns, "lossy")()).To(HaveField("Spec.AcquireTime.Time", BeTemporally("==", created.AcquireTime.Time)), "still the same hold")
}

// TestHolderKeepsLeaseThroughSlowRenewals checks that a renewal the API
// server answers slowly, later than the renew period but before the renew
// deadline, keeps the Lease: an attempt may use the time left until the
// deadline, so a loaded API server does not cost an instance its Lease.
func TestHolderKeepsLeaseThroughSlowRenewals(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ns := env().Namespace(t)

	const delay = 700 * time.Millisecond // over the renew period, under the deadline
	var slowed atomic.Int32
	c := interceptor.NewClient(watchClient(t), interceptor.Funcs{
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			slowed.Add(1)
			select {
			case <-time.After(delay):
			case <-ctx.Done():
				return ctx.Err()
			}
			return c.Update(ctx, obj, opts...)
		},
	})
	r := startHolderOn(t, c, leaseholder.Options{
		Ring: holderRing, Namespace: ns, Identity: "slow",
		LeaseDuration: 3 * time.Second, RenewPeriod: 300 * time.Millisecond, RenewDeadline: 2 * time.Second,
	})
	g.Eventually(r.Held).Should(BeTrue())
	first, err := getLease(ns, "slow")()
	g.Expect(err).NotTo(HaveOccurred())

	// Twice the renew deadline: without the slow renewals landing, the
	// holder would have given up by now.
	g.Consistently(r.lost.Load, 4*time.Second, 100*time.Millisecond).Should(BeZero(), "OnLost not called")
	g.Expect(r.Held()).To(BeTrue())
	g.Expect(slowed.Load()).To(BeNumerically(">=", 3), "renewals went through the slow path")
	g.Expect(getLease(ns, "slow")()).To(HaveField("Spec.RenewTime.Time", BeTemporally(">", first.Spec.RenewTime.Time)), "renewed")
}

// watchClient returns an admin client that can also watch.
func watchClient(t *testing.T) client.WithWatch {
	t.Helper()
	c, err := client.NewWithWatch(env().Config, client.Options{Scheme: env().Scheme})
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	return c
}

// TestHolderGivesUpAtRenewDeadline checks, on a fake clock, that a holder
// that cannot renew calls OnLost at RenewDeadline after the start of its last
// successful renewal, not before, and so ahead of the moment a successor could
// acquire the Lease (renewTime + LeaseDuration).
func TestHolderGivesUpAtRenewDeadline(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ns := env().Namespace(t)
	clk := clocktesting.NewFakeClock(time.Now())
	// Released long ago: acquired at the first attempt.
	createLease(t, holderRing, ns, "deadline", clk.Now().Add(-time.Hour), 3, func(l *coordinationv1.Lease) {
		l.Spec.HolderIdentity = ptr.To("")
	})
	var failing atomic.Bool
	var lostAt atomic.Pointer[time.Time]
	r := startHolder(t, leaseholder.Options{
		Ring: holderRing, Namespace: ns, Identity: "deadline",
		LeaseDuration: 3 * time.Second, RenewPeriod: time.Second, // RenewDeadline: 2s by default
		Clock: clk,
		Check: func(context.Context) error {
			if failing.Load() {
				return errors.New("unhealthy")
			}
			return nil
		},
		OnLost: func() {
			now := clk.Now()
			lostAt.Store(&now)
		},
	})
	g.Eventually(r.Held).Should(BeTrue())
	got, err := getLease(ns, "deadline")()
	g.Expect(err).NotTo(HaveOccurred())
	renewed := got.Spec.RenewTime.Time
	g.Expect(renewed).To(BeTemporally("~", clk.Now(), time.Microsecond), "stamped with the fake clock")

	// step moves the fake clock once the holder waits on it.
	step := func(d time.Duration) {
		g.Eventually(clk.HasWaiters).Should(BeTrue())
		clk.Step(d)
	}
	failing.Store(true)
	step(time.Second) // renewal fails; retried every 250ms
	for range 3 {
		step(250 * time.Millisecond)
	}
	g.Eventually(clk.HasWaiters).Should(BeTrue(), "waiting for the next attempt at 1.75s")
	g.Expect(lostAt.Load()).To(BeNil(), "not given up before the renew deadline")
	g.Expect(r.Held()).To(BeTrue())

	step(250 * time.Millisecond)
	g.Eventually(lostAt.Load).ShouldNot(BeNil())
	g.Expect(*lostAt.Load()).To(BeTemporally("~", renewed.Add(2*time.Second), time.Microsecond), "given up at the renew deadline")
	g.Expect(*lostAt.Load()).To(BeTemporally("<", renewed.Add(3*time.Second)), "before a successor could acquire the Lease")
	g.Expect(r.Held()).To(BeFalse())
}

// TestHolderStopsAtOnceWhenLeaseVanishes checks that a holder whose Lease is
// deleted, or leaves the ring (its ring label removed or changed), calls
// OnLost at once: long before its next renewal would have noticed.
func TestHolderStopsAtOnceWhenLeaseVanishes(t *testing.T) {
	t.Parallel()
	for name, vanish := range map[string]func(g Gomega, l *coordinationv1.Lease){
		"deleted": func(g Gomega, l *coordinationv1.Lease) {
			g.Expect(env().Client.Delete(context.Background(), l)).To(Succeed())
		},
		"ring label removed": func(g Gomega, l *coordinationv1.Lease) {
			patched := l.DeepCopy()
			delete(patched.Labels, v1alpha1.LabelRing)
			g.Expect(env().Client.Patch(context.Background(), patched, client.MergeFrom(l))).To(Succeed())
		},
		"ring label changed": func(g Gomega, l *coordinationv1.Lease) {
			patched := l.DeepCopy()
			patched.Labels[v1alpha1.LabelRing] = "another-ring"
			g.Expect(env().Client.Patch(context.Background(), patched, client.MergeFrom(l))).To(Succeed())
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			g := NewWithT(t)
			ns := env().Namespace(t)
			// Released long ago: acquired at once, no wait for a creation.
			createLease(t, holderRing, ns, "vanishing", time.Now().Add(-time.Hour), 60, func(l *coordinationv1.Lease) {
				l.Spec.HolderIdentity = ptr.To("")
			})
			// The next renewal is 20s away: only the watch can tell in time.
			r := startHolderOn(t, watchClient(t), leaseholder.Options{
				Ring: holderRing, Namespace: ns, Identity: "vanishing",
				LeaseDuration: 60 * time.Second, RenewPeriod: 20 * time.Second,
			})
			g.Eventually(r.Held).Should(BeTrue())
			held, err := getLease(ns, "vanishing")()
			g.Expect(err).NotTo(HaveOccurred())

			vanished := time.Now()
			vanish(g, held)
			g.Eventually(r.lost.Load, 5*time.Second).Should(BeEquivalentTo(1), "OnLost within 5s, not at the renewal 20s away")
			g.Expect(r.lostAt.Load().Sub(vanished)).To(BeNumerically("<", 5*time.Second))
			var stopped error
			g.Eventually(r.done).Should(Receive(&stopped))
			g.Expect(errors.Is(stopped, leaseholder.ErrLeaseLost)).To(BeTrue(), "Start returned %v", stopped)
			r.done <- stopped // for the cleanup
			g.Expect(r.Held()).To(BeFalse())

			// Nothing was written back: no new Lease, no ring label restored.
			after, err := getLease(ns, "vanishing")()
			if name == "deleted" {
				g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "not created again: %v", err)
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(after.Labels[v1alpha1.LabelRing]).NotTo(Equal(holderRing))
			g.Expect(after.Spec.RenewTime.Time).To(BeTemporally("==", held.Spec.RenewTime.Time), "not renewed after leaving the ring")
		})
	}
}

// TestHolderWaitsBeforeCreating checks, on a fake clock, that a holder that
// finds no Lease creates it only one lease duration later: a previous holder
// with the same instance ID whose Lease vanished has stopped by then.
func TestHolderWaitsBeforeCreating(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ns := env().Namespace(t)
	start := time.Now()
	clk := clocktesting.NewFakeClock(start)
	r := startHolder(t, leaseholder.Options{
		Ring: holderRing, Namespace: ns, Identity: "newcomer",
		LeaseDuration: 5 * time.Second, RenewPeriod: time.Second, Clock: clk,
	})
	for range 4 {
		g.Eventually(clk.HasWaiters).Should(BeTrue(), "the holder waits for its next attempt")
		_, err := getLease(ns, "newcomer")()
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "no Lease before a lease duration has passed (at %v): %v", clk.Since(start), err)
		g.Expect(r.Held()).To(BeFalse())
		clk.Step(time.Second)
	}
	g.Eventually(clk.HasWaiters).Should(BeTrue())
	_, err := getLease(ns, "newcomer")()
	g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "no Lease after 4s: %v", err)
	clk.Step(time.Second)
	g.Eventually(r.Held).Should(BeTrue())
	created, err := getLease(ns, "newcomer")()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(created.Spec.AcquireTime.Time).To(BeTemporally("~", start.Add(5*time.Second), time.Microsecond))
}

// TestHolderLeavesRingAtRenewal checks that a holder without a watch (its
// client cannot watch) notices a removed ring label at its next renewal and
// does not write the label back.
func TestHolderLeavesRingAtRenewal(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ns := env().Namespace(t)
	var plain client.Client = struct{ client.Client }{env().Client} // hides any Watch method
	r := startHolderOn(t, plain, leaseholder.Options{
		Ring: holderRing, Namespace: ns, Identity: "unwatched", LeaseDuration: 2 * time.Second, RenewPeriod: 100 * time.Millisecond,
	})
	g.Eventually(r.Held).Should(BeTrue())
	held, err := getLease(ns, "unwatched")()
	g.Expect(err).NotTo(HaveOccurred())
	patched := held.DeepCopy()
	delete(patched.Labels, v1alpha1.LabelRing)
	g.Expect(env().Client.Patch(context.Background(), patched, client.MergeFrom(held))).To(Succeed())

	var stopped error
	g.Eventually(r.done).Should(Receive(&stopped))
	g.Expect(errors.Is(stopped, leaseholder.ErrLeaseLost)).To(BeTrue(), "Start returned %v", stopped)
	r.done <- stopped // for the cleanup
	g.Expect(r.lost.Load()).To(BeEquivalentTo(1))
	g.Expect(getLease(ns, "unwatched")()).To(HaveField("Labels", Not(HaveKey(v1alpha1.LabelRing))))
}

// TestHolderAcquiresAtTransitionLimit checks that taking over a Lease whose
// leaseTransitions reached the largest int32 keeps the count there instead of
// overflowing into a negative value the API server rejects.
func TestHolderAcquiresAtTransitionLimit(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ns := env().Namespace(t)
	createLease(t, holderRing, ns, "pod-9", time.Now().Add(-time.Hour), 1, func(l *coordinationv1.Lease) {
		l.Spec.HolderIdentity = ptr.To(sharderIdentity) // taken by the sharder, its hold long over
		l.Spec.LeaseTransitions = ptr.To(int32(math.MaxInt32))
	})
	r := startHolder(t, leaseholder.Options{Ring: holderRing, Namespace: ns, Identity: "pod-9", LeaseDuration: 2 * time.Second, RenewPeriod: 100 * time.Millisecond})
	g.Eventually(r.Held).Should(BeTrue())
	got, err := getLease(ns, "pod-9")()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got.Spec.HolderIdentity).To(HaveValue(Equal("pod-9")))
	g.Expect(got.Spec.LeaseTransitions).To(HaveValue(BeEquivalentTo(math.MaxInt32)))
}

// TestHolderAcquiresSoonAfterCheckPasses checks that an acquisition that
// only Check refused (a controller still starting beside sharder agent) is
// tried again soon, not a whole renew period (5 s with the default lease
// duration) later: a restarted instance is back as soon as it can work.
func TestHolderAcquiresSoonAfterCheckPasses(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ns := env().Namespace(t)
	createLease(t, holderRing, ns, "pod-12", time.Now().Add(-time.Hour), 15, func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = ptr.To("") })
	var calls atomic.Int32
	var healthy atomic.Bool
	r := startHolder(t, leaseholder.Options{
		Ring: holderRing, Namespace: ns, Identity: "pod-12", // 15 s Lease: renewed every 5 s
		Check: func(context.Context) error {
			calls.Add(1)
			if !healthy.Load() {
				return errors.New("the controller is starting")
			}
			return nil
		},
	})
	g.Eventually(calls.Load).Should(BeNumerically(">=", 1))
	healthy.Store(true)
	healthyAt := time.Now()
	g.Eventually(r.Held, 10*time.Second, 10*time.Millisecond).Should(BeTrue())
	g.Expect(r.acquiredAt().Sub(healthyAt)).To(BeNumerically("<", 2*time.Second), "acquired a renew period after the check passed")
}

// TestHolderReleasesAfterDeadlineInShutdown checks that renewals failing
// past the renew deadline while BeforeRelease waits for the last reconciles
// (a controller stopping on a loaded machine) do not cost the release once
// nothing is in flight: the Lease is still handed back, so the sharder need
// not wait it out, and OnLost is called.
func TestHolderReleasesAfterDeadlineInShutdown(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ns := env().Namespace(t)
	createLease(t, holderRing, ns, "pod-13", time.Now().Add(-time.Hour), 2, func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = ptr.To("") })
	var stopping atomic.Bool
	r := startHolder(t, leaseholder.Options{
		Ring: holderRing, Namespace: ns, Identity: "pod-13", LeaseDuration: 2 * time.Second, RenewPeriod: 200 * time.Millisecond,
		Check: func(context.Context) error {
			if stopping.Load() {
				return errors.New("the API server does not answer in time")
			}
			return nil
		},
		BeforeRelease: func(ctx context.Context) error {
			stopping.Store(true)
			// The last reconcile takes longer than the renew deadline (1.33 s).
			select {
			case <-time.After(2 * time.Second):
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		},
	})
	g.Eventually(r.Held).Should(BeTrue())
	r.cancel()
	g.Eventually(r.done, 10*time.Second).Should(Receive(BeNil()))
	r.done <- nil // for the cleanup
	g.Expect(getLease(ns, "pod-13")()).To(HaveField("Spec.HolderIdentity", HaveValue(BeEmpty())), "released")
	g.Expect(r.lost.Load()).To(BeEquivalentTo(1))
}

// TestHolderProvesItsWatch checks WatchedAt and the promise on the Lease: a
// holder that watches its Lease sees its renewals come back and writes its
// max watch lag; one that cannot watch promises nothing.
func TestHolderProvesItsWatch(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ns := env().Namespace(t)
	opts := leaseholder.Options{Ring: holderRing, Namespace: ns, Identity: "watching",
		LeaseDuration: 3 * time.Second, RenewPeriod: 200 * time.Millisecond, MaxWatchLag: 2 * time.Second}
	r := startHolderOn(t, watchClient(t), opts)
	g.Expect(r.Watching()).To(BeTrue())
	g.Eventually(r.Held).Should(BeTrue())
	lease, err := getLease(ns, "watching")()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(lease.Annotations).To(HaveKeyWithValue(v1alpha1.AnnotationMaxWatchLag, "2s"))
	// Each renewal comes back through the watch: WatchedAt keeps moving and
	// stays within a few renew periods of now.
	g.Eventually(r.WatchedAt).ShouldNot(BeZero())
	seen := r.WatchedAt()
	g.Eventually(r.WatchedAt, 5*time.Second).Should(BeTemporally(">", seen))
	g.Expect(time.Since(r.WatchedAt())).To(BeNumerically("<", 2*time.Second))

	opts.Identity = "not-watching"
	plain := startHolderOn(t, env().Client, opts)
	g.Expect(plain.Watching()).To(BeFalse())
	g.Eventually(plain.Held).Should(BeTrue())
	lease, err = getLease(ns, "not-watching")()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(lease.Annotations).NotTo(HaveKey(v1alpha1.AnnotationMaxWatchLag), "no watch, no promise")
	g.Expect(plain.WatchedAt()).To(BeZero())
}

// TestHolderRenewsAtOnceAfterShutdownCutARenewal checks the stop of a holder
// while a renewal hangs on a slow API server: the shutdown cuts that
// attempt short, and the renewals that keep the Lease while BeforeRelease
// runs must start at once, since the last one that landed is already a
// renew period old, rather than a renew period after the stop, by which
// time the renew deadline has passed and the Lease is given up (and left
// for the sharder to take while the instance still reconciles).
func TestHolderRenewsAtOnceAfterShutdownCutARenewal(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ns := env().Namespace(t)
	var hang atomic.Bool
	hanging := make(chan time.Time, 1)
	c := interceptor.NewClient(watchClient(t), interceptor.Funcs{
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			if hang.CompareAndSwap(true, false) {
				hanging <- time.Now()
				<-ctx.Done() // the API server answers only after the caller gave up
				return ctx.Err()
			}
			return c.Update(ctx, obj, opts...)
		},
	})
	entered, finish := make(chan struct{}), make(chan struct{})
	var finishOnce sync.Once
	release := func() { finishOnce.Do(func() { close(finish) }) }
	// Renew deadline 2 s, renew period 1 s: the renewal that hangs starts a
	// second after the last one that landed.
	r := startHolderOn(t, c, leaseholder.Options{
		Ring: holderRing, Namespace: ns, Identity: "cut", LeaseDuration: 3 * time.Second, RenewPeriod: time.Second,
		BeforeRelease: func(context.Context) error {
			close(entered)
			<-finish
			return nil
		},
	})
	t.Cleanup(release)
	g.Eventually(r.Held).Should(BeTrue())
	hang.Store(true)
	var started time.Time
	g.Eventually(hanging, 5*time.Second).Should(Receive(&started))
	// Stopped half a renew period into the hanging renewal: 1.5 s after the
	// last renewal, half a second before the renew deadline.
	time.Sleep(time.Until(started.Add(500 * time.Millisecond)))
	r.cancel()
	g.Eventually(entered).Should(BeClosed())
	g.Consistently(func() (membership.State, error) {
		got, err := getLease(ns, "cut")()
		if err != nil {
			return "", err
		}
		state, _ := membership.StateOf(got, time.Now())
		return state, nil
	}, 4*time.Second, 50*time.Millisecond).Should(Equal(membership.StateReady), "renewed while BeforeRelease runs")
	g.Expect(r.lost.Load()).To(BeZero(), "the Lease was not given up")

	release()
	g.Eventually(r.done).Should(Receive(BeNil()))
	r.done <- nil // for the cleanup
	g.Expect(getLease(ns, "cut")()).To(HaveField("Spec.HolderIdentity", HaveValue(BeEmpty())))
}

// TestHolderReleasesAnAcquisitionCutByTheStop stops a holder while its
// acquisition is in flight: the write reached the API server, the reply had
// not come back. Everyone else sees the Lease held, so the sharder assigns
// the instance objects; the holder must release the Lease on its way out
// rather than leave it for the sharder to wait out for two lease durations.
func TestHolderReleasesAnAcquisitionCutByTheStop(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ns := env().Namespace(t)
	landed := make(chan struct{})
	var hung atomic.Bool
	hangReply := func(ctx context.Context, write func() error) error {
		if err := write(); err != nil || !hung.CompareAndSwap(false, true) {
			return err
		}
		close(landed)
		<-ctx.Done() // the reply comes only after the caller gave up
		return ctx.Err()
	}
	c := interceptor.NewClient(watchClient(t), interceptor.Funcs{
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			return hangReply(ctx, func() error { return c.Update(context.WithoutCancel(ctx), obj, opts...) })
		},
	})
	// A released Lease: acquired at once, by an update.
	createLease(t, holderRing, ns, "cut-short", time.Now(), 30, func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = ptr.To("") })
	r := startHolderOn(t, c, leaseholder.Options{
		Ring: holderRing, Namespace: ns, Identity: "cut-short", LeaseDuration: 30 * time.Second, RenewPeriod: 10 * time.Second,
	})
	g.Eventually(landed, 10*time.Second).Should(BeClosed())
	g.Expect(getLease(ns, "cut-short")()).To(HaveField("Spec.HolderIdentity", HaveValue(Equal("cut-short"))), "the acquisition landed")
	r.cancel()
	g.Eventually(r.done, 10*time.Second).Should(Receive(BeNil()))
	r.done <- nil // for the cleanup
	g.Expect(r.Held()).To(BeFalse())
	g.Expect(getLease(ns, "cut-short")()).To(HaveField("Spec.HolderIdentity", HaveValue(BeEmpty())), "released")
}
