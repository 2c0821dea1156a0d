package main

import (
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/slots"
)

func TestLeaseRenewal(t *testing.T) {
	at := func(s int) *metav1.MicroTime { m := metav1.NewMicroTime(time.Unix(int64(s), 0)); return &m }
	base := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "i", ResourceVersion: "1", Labels: map[string]string{"a": "b"}},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To("i"), AcquireTime: at(1), RenewTime: at(1), LeaseDurationSeconds: ptr.To[int32](15)},
	}
	renewed := base.DeepCopy()
	renewed.ResourceVersion, renewed.Spec.RenewTime = "2", at(5)
	if !leaseRenewal(base, renewed) {
		t.Error("a renewal is not one")
	}
	acked := renewed.DeepCopy()
	acked.Annotations = map[string]string{sharderv1alpha1.AnnotationSlotsAcknowledged: "uid/3"}
	if leaseRenewal(base, acked) {
		t.Error("an acknowledgement counts as a renewal")
	}
	if got := acknowledged(acked, "uid"); got != 3 {
		t.Errorf("acknowledged = %d, want 3", got)
	}
	if got := acknowledged(acked, "other"); got != 0 {
		t.Errorf("acknowledged for another ring = %d, want 0", got)
	}
	released := renewed.DeepCopy()
	released.Spec.HolderIdentity = nil
	labelled := renewed.DeepCopy()
	labelled.Labels = map[string]string{"a": "c"}
	reacquired := renewed.DeepCopy()
	reacquired.Spec.AcquireTime = at(5)
	for name, l := range map[string]*coordinationv1.Lease{"released": released, "labelled": labelled, "re-acquired": reacquired} {
		if leaseRenewal(base, l) {
			t.Errorf("%s counts as a renewal", name)
		}
	}
}

func slotTable(rev int64, holders ...string) slots.Table {
	t := slots.NewTable(len(holders))
	t.Revision = rev
	for i, h := range holders {
		t.Slots[i].Holder = h
	}
	return t
}

func TestMovedSlotsAndHandOvers(t *testing.T) {
	before := slotTable(1, "a", "a", "b", "")
	releasing := slotTable(2, "a", "a", "b", "c")
	releasing.Slots[1].Releasing, releasing.Slots[1].Since = true, 2
	after := slotTable(3, "a", "c", "b", "c")
	moves := movedSlots(before, after)
	if len(moves) != 1 || moves[0] != (slotMove{slot: 1, from: "a", to: "c"}) {
		t.Fatalf("moves = %+v, want slot 1 from a to c only (slot 3 was unassigned)", moves)
	}
	t0 := time.Unix(100, 0)
	tables := []tableAt{{at: t0, table: releasing}, {at: t0.Add(2 * time.Second), table: after}}
	acks := []ackAt{{at: t0.Add(500 * time.Millisecond), id: "a", revision: 1}, {at: t0.Add(time.Second), id: "a", revision: 2}}
	reconciled := t0.Add(2500 * time.Millisecond)
	first := func(id string, slot int, after time.Time) time.Time {
		if id == "c" && slot == 1 && !reconciled.Before(after) {
			return reconciled
		}
		return time.Time{}
	}
	hs := handOvers(moves, tables, acks, first)
	if len(hs) != 1 || !hs[0].acked || !hs[0].released.Equal(t0.Add(time.Second)) || !hs[0].granted.Equal(t0.Add(2*time.Second)) {
		t.Fatalf("hand-over = %+v, want released by the acknowledgement of revision 2, granted at +2s", hs)
	}
	ds, missing := latencies(hs, true)
	if missing != 0 || len(ds) != 1 || ds[0] != 1500*time.Millisecond {
		t.Errorf("latencies = %v (%d missing), want [1.5s]", ds, missing)
	}
	// With no acknowledgement, the hand-over is timed from the grant.
	hs = handOvers(moves, tables, nil, first)
	if ds, _ := latencies(hs, false); len(ds) != 1 || ds[0] != 500*time.Millisecond {
		t.Errorf("latencies without acknowledgement = %v, want [500ms]", ds)
	}
}

func TestBalancedAndFigures(t *testing.T) {
	if !balanced(slotTable(1, "a", "b", "a"), []string{"a", "b"}) {
		t.Error("2 + 1 slots over 2 instances is balanced")
	}
	if balanced(slotTable(1, "a", "a", "a"), []string{"a", "b"}) {
		t.Error("every slot on one of 2 instances is balanced")
	}
	if balanced(slotTable(1, "a", "c", "b"), []string{"a", "b"}) {
		t.Error("a slot on an instance not live is balanced")
	}
	r := slotTable(1, "a", "b")
	r.Slots[0].Releasing = true
	if balanced(r, []string{"a", "b"}) {
		t.Error("a releasing slot is balanced")
	}
	ds := []time.Duration{1, 2, 3, 4}
	if quantile(ds, 0.5) != 2 || quantile(ds, 1) != 4 || quantile(nil, 0.5) != 0 {
		t.Error("quantile")
	}
	t0 := time.Unix(0, 0)
	if n := countBetween([]time.Time{t0, t0.Add(time.Second), t0.Add(3 * time.Second)}, t0, t0.Add(time.Second)); n != 2 {
		t.Errorf("countBetween = %d, want 2", n)
	}
	if got := statusRSSParts("Name:\tx\nRssAnon:\t    2048 kB\nRssFile:\t   1024 kB\n"); got != "anon 2.0 MiB, file 1.0 MiB" {
		t.Errorf("statusRSSParts = %q", got)
	}
}

// TestSlotsExtraFlags: the report's command line names the flags it ran
// with, as flags the command accepts.
func TestSlotsExtraFlags(t *testing.T) {
	if got := slotsExtraFlags(params{leaseDuration: defaultLeaseDuration}); got != "" {
		t.Errorf("defaults: %q, want none", got)
	}
	p := params{leaseDuration: 30 * time.Second, sharderEnv: []string{"GOGC=50"}, sharderArgs: []string{"--leader-election-lease-duration=60s"}}
	want := " --lease-duration 30s --sharder-env=GOGC=50 --sharder-arg=--leader-election-lease-duration=60s"
	if got := slotsExtraFlags(p); got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}
