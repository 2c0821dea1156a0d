package assign_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/assign"
	"github.com/sharder-dev/sharder/pkg/leases"
)

func createLease(t *testing.T, ns, id string) *coordinationv1.Lease {
	t.Helper()
	now := metav1.NewMicroTime(time.Now())
	l := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: id, Labels: map[string]string{v1alpha1.LabelRing: ns}},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       ptr.To(id),
			LeaseDurationSeconds: ptr.To[int32](3600),
			AcquireTime:          &now,
			RenewTime:            &now,
		},
	}
	if err := env.Client.Create(context.Background(), l); err != nil {
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
	ns := env.Namespace(t)
	newRing(t, ns, nil)
	createLease(t, ns, "a")
	b := createLease(t, ns, "b")
	names := createConfigMaps(t, ns, "cm", 20)
	reg := leases.NewRegistry()
	startSharderWith(t, env.Config, reg, assign.Options{}, func(mgr ctrl.Manager) error {
		return leases.NewController(leases.ControllerOptions{Registry: reg}).SetupWithManager(mgr)
	})

	both := []string{"a", "b"}
	g.Eventually(func(g Gomega) {
		got := labelsOf(g, ns)
		for _, name := range names {
			g.Expect(got[name]).To(HaveKeyWithValue(v1alpha1.ShardLabel(ns), expected(t, both, ns, name)))
		}
	}, timeout, poll).Should(Succeed())

	// Instance b shuts down and releases its Lease: its objects go to a.
	h := watchHistory(t, configMaps, ns, ns)
	g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(b), b)).To(Succeed())
	b.Spec.HolderIdentity = nil
	g.Expect(env.Client.Update(ctx, b)).To(Succeed())
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
			if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: id}, l); err == nil {
				now := metav1.NewMicroTime(time.Now())
				l.Spec.RenewTime = &now
				if env.Client.Update(ctx, l) == nil {
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
			g.Expect(env.Client.Delete(context.Background(), l)).To(Succeed())
		},
		"ring label removed": func(g Gomega, l *coordinationv1.Lease) {
			g.Expect(env.Client.Get(context.Background(), client.ObjectKeyFromObject(l), l)).To(Succeed())
			delete(l.Labels, v1alpha1.LabelRing)
			g.Expect(env.Client.Update(context.Background(), l)).To(Succeed())
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			g := NewWithT(t)
			ns := env.Namespace(t)
			newRing(t, ns, nil)
			createLease(t, ns, "a")
			b := createLease(t, ns, "b")
			b.Spec.LeaseDurationSeconds = ptr.To[int32](leaseSeconds)
			g.Expect(env.Client.Update(context.Background(), b)).To(Succeed())
			stopRenewing := renewing(t, ns, "b", 300*time.Millisecond)
			names := createConfigMaps(t, ns, "cm", 30)
			reg := leases.NewRegistry()
			startSharderWith(t, env.Config, reg, assign.Options{}, func(mgr ctrl.Manager) error {
				return leases.NewController(leases.ControllerOptions{Registry: reg}).SetupWithManager(mgr)
			})
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
