package leasecontroller_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"k8s.io/utils/clock"

	"github.com/sharder-dev/sharder/pkg/instance/leaseholder"
	"github.com/sharder-dev/sharder/pkg/membership"
)

// TestDetectionTimes measures, on the real clock and with a 2 s lease duration, how long the
// sharder takes to declare an instance dead: after its last renewal (a
// crash) and after a graceful release. It logs the figures (go test -v -run
// TestDetectionTimes) and asserts only the protocol: expired from t+d,
// never dead before t+2d, dead at once after a release.
func TestDetectionTimes(t *testing.T) {
	t.Parallel()
	const d = 2 * time.Second

	t.Run("crash", func(t *testing.T) {
		t.Parallel()
		g := NewWithT(t)
		ring, ns := newRing(t)
		s := startSharder(t, clock.RealClock{}, ring, ns)
		lease := createLease(t, ring, ns, "crash", time.Now(), int32(d/time.Second))
		renewed := lease.Spec.RenewTime.Time
		g.Eventually(s.stateOf(ring, "crash"), 3*d).Should(Equal(membership.StateDead))

		expired, _ := s.published.firstTime(ring, "crash", membership.StateExpired)
		dead, _ := s.published.firstTime(ring, "crash", membership.StateDead)
		g.Expect(expired).To(BeTemporally(">=", renewed.Add(d)))
		g.Expect(dead).To(BeTemporally(">=", renewed.Add(2*d)))
		t.Logf("lease duration %v: last renewal -> expired %v, -> dead %v (%.2f × duration)",
			d, expired.Sub(renewed).Round(time.Millisecond), dead.Sub(renewed).Round(time.Millisecond), float64(dead.Sub(renewed))/float64(d))
	})

	t.Run("release", func(t *testing.T) {
		t.Parallel()
		g := NewWithT(t)
		ring, ns := newRing(t)
		s := startSharder(t, clock.RealClock{}, ring, ns)
		holder, err := leaseholder.NewHolder(env().Client, leaseholder.Options{Ring: ring, Namespace: ns, Identity: "release", LeaseDuration: d})
		g.Expect(err).NotTo(HaveOccurred())
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- holder.Start(ctx) }()
		g.Eventually(s.stateOf(ring, "release")).Should(Equal(membership.StateReady))

		released := time.Now()
		cancel()
		select {
		case err := <-done:
			g.Expect(err).NotTo(HaveOccurred())
		case <-time.After(d):
			t.Fatal("the holder did not return within the lease duration")
		}
		returned := time.Now()
		g.Eventually(s.stateOf(ring, "release"), d).Should(Equal(membership.StateDead))
		dead, _ := s.published.firstTime(ring, "release", membership.StateDead)
		g.Expect(dead).To(BeTemporally("<", released.Add(d)))
		t.Logf("lease duration %v: release started -> released %v, -> dead %v",
			d, returned.Sub(released).Round(time.Millisecond), dead.Sub(released).Round(time.Millisecond))
	})
}
