package slottable

import (
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/sharder/leasecontroller"
	"github.com/sharder-dev/sharder/pkg/slots"
)

// lease returns instance id's Lease held by holder for seconds, fenced or not.
func lease(id, holder string, seconds int32, fenced bool) *coordinationv1.Lease {
	l := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: id, Annotations: map[string]string{}},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder), LeaseDurationSeconds: ptr.To(seconds)},
	}
	if fenced {
		l.Annotations[v1alpha1.AnnotationFenced] = "true"
	}
	return l
}

// TestFenceWait: a gone instance the sharder fenced is movable only one
// lease duration of the instance after the fence, however the cache shows
// its Lease meanwhile; a fence first seen on a Lease (a new leader) counts
// from then, for half the taken Lease's duration; a fence whose wait is over
// is forgotten once the Lease no longer shows it.
func TestFenceWait(t *testing.T) {
	registry := leasecontroller.NewRegistry()
	registry.Set("r", []membership.Member{
		{ID: "a", State: membership.StateReady},
		{ID: "f", State: membership.StateDead, Movable: true},
		{ID: "g", State: membership.StateDead, Movable: true},
	})
	c, err := New(Options{Registry: registry, Identity: "sharder:test"})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	ring := &v1alpha1.ControllerRing{ObjectMeta: metav1.ObjectMeta{Name: "r", UID: "uid"}}
	st := c.state(ring)
	table := slots.Table{Slots: []slots.Slot{{Holder: "f"}, {Holder: "g"}, {Holder: "a"}}}
	// f was fenced by this process (wait 10s); the cache still shows its
	// Lease as the instance held it. g's Lease is found fenced, taken for
	// 20s: a wait of 10s from now.
	st.fenced["f"] = fence{at: t0, wait: 10 * time.Second}
	leases := map[string]*coordinationv1.Lease{
		"a": lease("a", "a", 10, false),
		"f": lease("f", "f", 10, false),
		"g": lease("g", "sharder:test", 20, true),
	}

	check := func(now time.Time, wantF, wantG bool, wantNext time.Time) {
		t.Helper()
		in, next := c.input(ring, table, leases, st, now)
		if got := in.Instances["f"].Movable; got != wantF {
			t.Errorf("at +%s: f movable %v, want %v", now.Sub(t0), got, wantF)
		}
		if got := in.Instances["g"].Movable; got != wantG {
			t.Errorf("at +%s: g movable %v, want %v", now.Sub(t0), got, wantG)
		}
		if !next.Equal(wantNext) {
			t.Errorf("at +%s: next %s, want +%s", now.Sub(t0), next.Sub(t0), wantNext.Sub(t0))
		}
	}
	check(t0.Add(time.Second), false, false, t0.Add(10*time.Second))
	check(t0.Add(10*time.Second), true, false, t0.Add(11*time.Second))
	check(t0.Add(11*time.Second), true, true, time.Time{})
	if _, ok := st.fenced["f"]; ok {
		t.Error("f's fence is remembered after its wait although its Lease does not show it")
	}
	if _, ok := st.fenced["g"]; !ok {
		t.Error("g's fence is forgotten while its Lease shows it")
	}
}

// TestUnknownHolders: a holder of slots that is no member is vanished
// (keeps its slots) however long after the start, until the lease
// controller publishes it and holds it; a holder whose name no Lease can
// have is dead and movable at once.
func TestUnknownHolders(t *testing.T) {
	c, err := New(Options{Registry: leasecontroller.NewRegistry(), Identity: "sharder:test"})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	ring := &v1alpha1.ControllerRing{ObjectMeta: metav1.ObjectMeta{Name: "r", UID: "uid"}}
	st := c.state(ring)
	table := slots.Table{Slots: []slots.Slot{{Holder: "x"}, {Holder: "Not_A_Lease"}, {}}}
	for _, at := range []time.Time{t0, t0.Add(time.Hour)} {
		in, next := c.input(ring, table, nil, st, at)
		if got := in.Instances["x"]; got.State != membership.StateVanished || got.Movable || !next.IsZero() {
			t.Errorf("at %v: %+v, next %s; want vanished, not movable, decided again on a membership change", at, got, next)
		}
		if got := in.Instances["Not_A_Lease"]; got.State != membership.StateDead || !got.Movable {
			t.Errorf("at %v, an ID no Lease can have: %+v; want dead and movable", at, got)
		}
	}
}
