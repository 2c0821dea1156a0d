package membership

import (
	"errors"
	"math"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

var epoch = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// instanceLease returns a Lease named id held by holder, renewed at renew
// with a duration of seconds.
func instanceLease(id, holder string, renew time.Time, seconds int32) *coordinationv1.Lease {
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: id, Namespace: "ns", Labels: map[string]string{v1alpha1.LabelRing: "r"}},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       ptr.To(holder),
			RenewTime:            ptr.To(metav1.NewMicroTime(renew)),
			LeaseDurationSeconds: ptr.To(seconds),
		},
	}
}

// TestStateOfLifecycle walks a Lease that is no longer renewed through its
// states with a fake clock, following the next transition StateOf returns.
func TestStateOfLifecycle(t *testing.T) {
	g := NewWithT(t)
	clock := clocktesting.NewFakeClock(epoch)
	lease := instanceLease("a", "a", epoch, 10)

	type step struct {
		at    time.Duration // after the last renewal
		state State
		next  time.Duration // zero: no next transition
	}
	for _, s := range []step{
		{0, StateReady, 10 * time.Second},
		{9*time.Second + 999*time.Millisecond, StateReady, 10 * time.Second},
		{10 * time.Second, StateExpired, 20 * time.Second},
		{19 * time.Second, StateExpired, 20 * time.Second},
		{20 * time.Second, StateUncertain, 0},
		{time.Hour, StateUncertain, 0},
	} {
		clock.SetTime(epoch.Add(s.at))
		state, next := StateOf(lease, clock.Now())
		g.Expect(state).To(Equal(s.state), "at +%v", s.at)
		if s.next == 0 {
			g.Expect(next.IsZero()).To(BeTrue(), "at +%v", s.at)
		} else {
			g.Expect(next).To(Equal(epoch.Add(s.next)), "at +%v", s.at)
		}
	}

	// The sharder takes the uncertain Lease for 2d: dead, orphaned 10 of the
	// Lease's (new) durations after the takeover.
	taken := epoch.Add(time.Hour)
	clock.SetTime(taken)
	lease.Spec.HolderIdentity = ptr.To("sharder:sharder-0")
	lease.Spec.RenewTime = ptr.To(metav1.NewMicroTime(taken))
	lease.Spec.LeaseDurationSeconds = ptr.To[int32](20)
	state, next := StateOf(lease, clock.Now())
	g.Expect(state).To(Equal(StateDead))
	g.Expect(next).To(Equal(taken.Add(200 * time.Second)))
	clock.Step(200*time.Second - time.Nanosecond)
	state, _ = StateOf(lease, clock.Now())
	g.Expect(state).To(Equal(StateDead))
	clock.Step(time.Nanosecond)
	state, next = StateOf(lease, clock.Now())
	g.Expect(state).To(Equal(StateOrphaned))
	g.Expect(next.IsZero()).To(BeTrue())

	// The instance comes back and re-acquires: ready again.
	lease.Spec.HolderIdentity = ptr.To("a")
	lease.Spec.RenewTime = ptr.To(metav1.NewMicroTime(clock.Now()))
	lease.Spec.LeaseDurationSeconds = ptr.To[int32](10)
	state, _ = StateOf(lease, clock.Now())
	g.Expect(state).To(Equal(StateReady))
}

func TestStateOfCases(t *testing.T) {
	created := metav1.NewTime(epoch.Add(-time.Second))
	for _, tc := range []struct {
		name  string
		lease func() *coordinationv1.Lease
		now   time.Time
		state State
		next  time.Time
	}{{
		name:  "released: dead until 10d after the release",
		lease: func() *coordinationv1.Lease { return instanceLease("a", "", epoch, 2) },
		now:   epoch.Add(19 * time.Second),
		state: StateDead, next: epoch.Add(20 * time.Second),
	}, {
		name:  "released long ago: orphaned",
		lease: func() *coordinationv1.Lease { return instanceLease("a", "", epoch, 2) },
		now:   epoch.Add(20 * time.Second),
		state: StateOrphaned,
	}, {
		name:  "held by another identity: dead even while its hold is fresh",
		lease: func() *coordinationv1.Lease { return instanceLease("a", "b", epoch, 2) },
		now:   epoch,
		state: StateDead, next: epoch.Add(20 * time.Second),
	}, {
		name: "no holder identity at all: dead",
		lease: func() *coordinationv1.Lease {
			l := instanceLease("a", "", epoch, 2)
			l.Spec.HolderIdentity = nil
			return l
		},
		now:   epoch,
		state: StateDead, next: epoch.Add(20 * time.Second),
	}, {
		name: "no duration: the default duration applies",
		lease: func() *coordinationv1.Lease {
			l := instanceLease("a", "a", epoch, 0)
			l.Spec.LeaseDurationSeconds = nil
			return l
		},
		now:   epoch.Add(DefaultLeaseDuration - time.Nanosecond),
		state: StateReady, next: epoch.Add(DefaultLeaseDuration),
	}, {
		name:  "negative duration: the default duration applies",
		lease: func() *coordinationv1.Lease { return instanceLease("a", "a", epoch, -5) },
		now:   epoch.Add(DefaultLeaseDuration),
		state: StateExpired, next: epoch.Add(2 * DefaultLeaseDuration),
	}, {
		name:  "huge duration: capped at MaxLeaseDuration",
		lease: func() *coordinationv1.Lease { return instanceLease("a", "", epoch, 1<<31-1) },
		now:   epoch.Add(10 * MaxLeaseDuration),
		state: StateOrphaned,
	}, {
		name: "no renew time: the acquire time counts",
		lease: func() *coordinationv1.Lease {
			l := instanceLease("a", "a", epoch, 2)
			l.Spec.RenewTime = nil
			l.Spec.AcquireTime = ptr.To(metav1.NewMicroTime(epoch.Add(time.Second)))
			return l
		},
		now:   epoch.Add(2 * time.Second),
		state: StateReady, next: epoch.Add(3 * time.Second),
	}, {
		name: "no renew or acquire time: the creation time counts",
		lease: func() *coordinationv1.Lease {
			l := instanceLease("a", "a", epoch, 2)
			l.Spec.RenewTime = nil
			l.CreationTimestamp = created
			return l
		},
		now:   epoch,
		state: StateReady, next: created.Add(2 * time.Second),
	}, {
		name: "no time at all, held: uncertain",
		lease: func() *coordinationv1.Lease {
			l := instanceLease("a", "a", epoch, 2)
			l.Spec.RenewTime = nil
			return l
		},
		now:   epoch,
		state: StateUncertain,
	}, {
		name: "no time at all, released: orphaned",
		lease: func() *coordinationv1.Lease {
			l := instanceLease("a", "", epoch, 2)
			l.Spec.RenewTime = nil
			return l
		},
		now:   epoch,
		state: StateOrphaned,
	}, {
		name:  "renew time in the future (clock skew): ready until t+d",
		lease: func() *coordinationv1.Lease { return instanceLease("a", "a", epoch.Add(time.Minute), 2) },
		now:   epoch,
		state: StateReady, next: epoch.Add(time.Minute + 2*time.Second),
	}} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			state, next := StateOf(tc.lease(), tc.now)
			g.Expect(state).To(Equal(tc.state))
			g.Expect(next).To(BeTemporally("==", tc.next))
		})
	}
}

func TestVirtualNodesOf(t *testing.T) {
	for _, tc := range []struct {
		label   *string
		want    int
		wantErr bool
	}{
		{label: nil, want: 0},
		{label: ptr.To("1"), want: 1},
		{label: ptr.To("256"), want: 256},
		{label: ptr.To("10000"), want: MaxVirtualNodes},
		{label: ptr.To("10001"), wantErr: true},
		{label: ptr.To("0"), wantErr: true},
		{label: ptr.To("-3"), wantErr: true},
		{label: ptr.To("many"), wantErr: true},
		{label: ptr.To(""), wantErr: true},
		{label: ptr.To("1.5"), wantErr: true},
		{label: ptr.To("99999999999999999999999"), wantErr: true},
	} {
		name := "absent"
		if tc.label != nil {
			name = "label=" + *tc.label
		}
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			lease := instanceLease("a", "a", epoch, 2)
			if tc.label != nil {
				lease.Labels[v1alpha1.LabelVirtualNodes] = *tc.label
			}
			n, err := VirtualNodesOf(lease)
			if tc.wantErr {
				g.Expect(errors.Is(err, ErrInvalidVirtualNodes)).To(BeTrue(), "error %v", err)
				g.Expect(n).To(BeZero())
				// The member keeps its place with the ring's default weight.
				g.Expect(MemberOf(lease, epoch)).To(Equal(Member{ID: "a", VirtualNodes: 0, State: StateReady}))
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(n).To(Equal(tc.want))
			g.Expect(MemberOf(lease, epoch)).To(Equal(Member{ID: "a", VirtualNodes: tc.want, State: StateReady}))
		})
	}
}

// FuzzStateOf checks that any Lease gets a state and that a next transition,
// when there is one, lies after now and leads to a different state.
func FuzzStateOf(f *testing.F) {
	f.Add("a", "a", int64(0), int32(2), int64(1), true, "128")
	f.Add("a", "", int64(0), int32(0), int64(100), false, "x")
	f.Add("a", "b", int64(-5), int32(-1), int64(30), true, "")
	f.Add("a", "a", int64(0), int32(1<<31-1), int64(1<<62), true, "7")
	f.Fuzz(func(t *testing.T, name, holder string, renewOffset int64, seconds int32, nowOffset int64, hasRenew bool, weight string) {
		lease := instanceLease(name, holder, epoch.Add(time.Duration(renewOffset)*time.Millisecond), seconds)
		if !hasRenew {
			lease.Spec.RenewTime = nil
		}
		lease.Labels[v1alpha1.LabelVirtualNodes] = weight
		now := epoch.Add(time.Duration(nowOffset) * time.Millisecond)
		state, next := StateOf(lease, now)
		switch state {
		case StateReady, StateExpired, StateUncertain, StateDead, StateOrphaned:
		default:
			t.Fatalf("unknown state %q", state)
		}
		if !next.IsZero() {
			if !next.After(now) {
				t.Fatalf("next transition %v is not after now %v", next, now)
			}
			if later, _ := StateOf(lease, next); later == state {
				t.Fatalf("state %q does not change at its next transition %v", state, next)
			}
		}
		m := MemberOf(lease, now)
		if m.VirtualNodes < 0 || m.VirtualNodes > MaxVirtualNodes || m.State != state || m.ID != name {
			t.Fatalf("bad member %+v", m)
		}
	})
}

// TestNextTransition checks that a change of holder is counted up to the
// largest int32 and kept there.
func TestNextTransition(t *testing.T) {
	for n, want := range map[int32]int32{0: 1, 41: 42, math.MaxInt32 - 1: math.MaxInt32, math.MaxInt32: math.MaxInt32} {
		if got := NextTransition(n); got != want {
			t.Errorf("NextTransition(%d) = %d, want %d", n, got, want)
		}
	}
}

func TestMaxWatchLagOf(t *testing.T) {
	for _, tc := range []struct {
		annotation *string
		want       time.Duration
		wantErr    bool
	}{
		{annotation: nil, want: 0},
		{annotation: ptr.To("10s"), want: 10 * time.Second},
		{annotation: ptr.To("1m30s"), want: 90 * time.Second},
		{annotation: ptr.To("24h"), want: MaxLeaseDuration},
		{annotation: ptr.To("25h"), wantErr: true},
		{annotation: ptr.To("0s"), wantErr: true},
		{annotation: ptr.To("-1s"), wantErr: true},
		{annotation: ptr.To("10"), wantErr: true},
		{annotation: ptr.To(""), wantErr: true},
		{annotation: ptr.To("soon"), wantErr: true},
	} {
		name := "absent"
		if tc.annotation != nil {
			name = "annotation=" + *tc.annotation
		}
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			lease := instanceLease("a", "a", epoch, 2)
			if tc.annotation != nil {
				lease.Annotations = map[string]string{v1alpha1.AnnotationMaxWatchLag: *tc.annotation}
			}
			d, err := MaxWatchLagOf(lease)
			var tracker Tracker
			observed, _ := tracker.Observe("ring", 0, lease, epoch)
			if tc.wantErr {
				g.Expect(errors.Is(err, ErrInvalidMaxWatchLag)).To(BeTrue(), "error %v", err)
				g.Expect(d).To(BeZero())
				// A malformed promise is no promise; the member is unchanged otherwise.
				g.Expect(MemberOf(lease, epoch)).To(Equal(Member{ID: "a", State: StateReady}))
				g.Expect(observed).To(Equal(Member{ID: "a", State: StateReady}))
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(d).To(Equal(tc.want))
			g.Expect(MemberOf(lease, epoch)).To(Equal(Member{ID: "a", State: StateReady, MaxWatchLag: tc.want}))
			g.Expect(observed).To(Equal(Member{ID: "a", State: StateReady, MaxWatchLag: tc.want}))
		})
	}
}
