package main

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/types"

	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/slots"
)

// Pure figures of the slots mode (--slots), from what its watches recorded.

// leaseRenewal reports whether a Lease update from old to cur changed
// nothing but spec.renewTime: a renewal on schedule. Any other change
// (holder, acquire time, transitions, duration, labels, annotations such as
// an acknowledgement) is a write of its own in the slots mode's counts.
func leaseRenewal(old, cur *coordinationv1.Lease) bool {
	a, b := old.DeepCopy(), cur.DeepCopy()
	a.Spec.RenewTime, b.Spec.RenewTime = nil, nil
	for _, l := range []*coordinationv1.Lease{a, b} {
		l.ResourceVersion, l.ManagedFields, l.Generation = "", nil, 0
	}
	return equalLease(a, b)
}

func equalLease(a, b *coordinationv1.Lease) bool {
	return maps.Equal(a.Labels, b.Labels) && maps.Equal(a.Annotations, b.Annotations) &&
		ptrEqual(a.Spec.HolderIdentity, b.Spec.HolderIdentity) &&
		ptrEqual(a.Spec.LeaseDurationSeconds, b.Spec.LeaseDurationSeconds) &&
		ptrEqual(a.Spec.LeaseTransitions, b.Spec.LeaseTransitions) &&
		a.Spec.AcquireTime.Equal(b.Spec.AcquireTime) &&
		a.DeletionTimestamp.Equal(b.DeletionTimestamp)
}

func ptrEqual[T comparable](a, b *T) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// acknowledged returns the revision a Lease's acknowledgement names for
// the ring of uid, 0 without one.
func acknowledged(l *coordinationv1.Lease, uid string) int64 {
	return slots.ParseAcknowledgement(l.Annotations[sharderv1alpha1.AnnotationSlotsAcknowledged], types.UID(uid))
}

// slotMove is one slot that changed holder over a membership change.
type slotMove struct {
	slot     int
	from, to string
}

// movedSlots returns the slots whose holder differs between two tables,
// ascending; a slot unassigned before is not a move.
func movedSlots(before, after slots.Table) []slotMove {
	var out []slotMove
	for i := range min(len(before.Slots), len(after.Slots)) {
		b, a := before.Slots[i], after.Slots[i]
		if b.Holder != "" && a.Holder != "" && b.Holder != a.Holder {
			out = append(out, slotMove{slot: i, from: b.Holder, to: a.Holder})
		}
	}
	return out
}

// tableAt is one slot table as a ring write showed it.
type tableAt struct {
	at    time.Time
	table slots.Table
}

// ackAt is one acknowledgement as a Lease write showed it.
type ackAt struct {
	at       time.Time
	id       string
	revision int64
}

// handOver is when one moved slot was let go by its old holder and first
// reconciled by its new one.
type handOver struct {
	move slotMove
	// released is the old holder's acknowledgement covering the slot (ok
	// acked), else the write that granted the slot to its new holder.
	released time.Time
	acked    bool
	// granted is the ring write that granted the slot to its new holder.
	granted time.Time
	// reconciled is the new holder's first reconcile of one of the slot's
	// objects after the grant; zero when none was seen.
	reconciled time.Time
}

// handOvers follows each move through the ring writes, the
// acknowledgements and the new holders' reconciles, all since t0 and
// sorted by time; firstReconcile returns the first reconcile by id of the
// slot at or after a time.
func handOvers(moves []slotMove, tables []tableAt, acks []ackAt, firstReconcile func(id string, slot int, after time.Time) time.Time) []handOver {
	out := make([]handOver, 0, len(moves))
	for _, m := range moves {
		h := handOver{move: m}
		var since int64
		for _, t := range tables {
			s := t.table.Slots[m.slot]
			if since == 0 && s.Holder == m.from && s.Releasing {
				since = s.Since
			}
			if s.Holder == m.to && !s.Releasing {
				h.granted = t.at
				break
			}
		}
		if since > 0 {
			for _, a := range acks {
				if a.id == m.from && a.revision >= since && (h.granted.IsZero() || !a.at.After(h.granted)) {
					h.released, h.acked = a.at, true
					break
				}
			}
		}
		if !h.acked {
			h.released = h.granted
		}
		if !h.granted.IsZero() {
			h.reconciled = firstReconcile(m.to, m.slot, h.granted)
		}
		out = append(out, h)
	}
	return out
}

// latencies returns the sorted times from each hand-over's release to its
// new holder's first reconcile (acked: only those released by an
// acknowledgement, else only the others), and how many had no reconcile.
func latencies(hs []handOver, acked bool) (ds []time.Duration, missing int) {
	for _, h := range hs {
		if h.acked != acked {
			continue
		}
		if h.reconciled.IsZero() {
			missing++
			continue
		}
		ds = append(ds, h.reconciled.Sub(h.released))
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds, missing
}

// quantile returns the q-quantile of sorted durations (nearest rank), 0
// for none.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.999999) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// balanced reports whether a table grants every slot to one of live, none
// releasing, each live instance within one slot of an equal share.
func balanced(t slots.Table, live []string) bool {
	if len(live) == 0 || len(t.Slots) == 0 {
		return false
	}
	n := map[string]int{}
	for _, s := range t.Slots {
		if s.Holder == "" || s.Releasing || !slices.Contains(live, s.Holder) {
			return false
		}
		n[s.Holder]++
	}
	lo := len(t.Slots) / len(live)
	for _, id := range live {
		if n[id] < lo || n[id] > lo+1 {
			return false
		}
	}
	return true
}

// countBetween returns how many times lie in [from, to].
func countBetween(ts []time.Time, from, to time.Time) int {
	n := 0
	for _, t := range ts {
		if !t.Before(from) && !t.After(to) {
			n++
		}
	}
	return n
}

// statusRSSParts reads RssAnon and RssFile from the text of
// /proc/<pid>/status as "anon X MiB, file Y MiB".
func statusRSSParts(status string) string {
	kib := map[string]uint64{}
	for _, line := range strings.Split(status, "\n") {
		name, rest, ok := strings.Cut(line, ":")
		if !ok || (name != "RssAnon" && name != "RssFile") {
			continue
		}
		var n uint64
		if _, err := fmt.Sscanf(strings.TrimSpace(rest), "%d kB", &n); err == nil {
			kib[name] = n
		}
	}
	if len(kib) != 2 {
		return ""
	}
	return fmt.Sprintf("anon %s, file %s", mib(kib["RssAnon"]<<10), mib(kib["RssFile"]<<10))
}
