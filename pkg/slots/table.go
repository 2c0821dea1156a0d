package slots

import (
	"fmt"
	"maps"
	"slices"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// Table is a ring's slot table: who holds every slot and whether it is
// asked to let go of it. It is the ring's status.slots in a form to decide
// on; FromStatus and Status convert.
type Table struct {
	// Revision grows by one with every change of the table (Step).
	Revision int64
	// Slots are the slots by number; len(Slots) is the ring's slot count.
	Slots []Slot
}

// Slot is the state of one slot.
type Slot struct {
	// Holder is the instance the slot is granted to, or releasing from;
	// empty when the slot is unassigned.
	Holder string
	// Releasing reports whether Holder is asked to let go of the slot. It
	// may reconcile the slot's objects until it acknowledges Since.
	Releasing bool
	// Since is the revision of the table that asked for the release; 0
	// unless Releasing.
	Since int64
}

// NewTable returns the table of a ring of count slots before its first
// write: revision 0, every slot unassigned.
func NewTable(count int) Table { return Table{Slots: make([]Slot, count)} }

// Clone returns a copy of t that shares nothing with it.
func (t Table) Clone() Table { return Table{Revision: t.Revision, Slots: slices.Clone(t.Slots)} }

// Holders returns the holder of every slot ("" for an unassigned one), the
// input of Plan.
func (t Table) Holders() []string {
	out := make([]string, len(t.Slots))
	for i, s := range t.Slots {
		out[i] = s.Holder
	}
	return out
}

// HeldBy returns the slots holder holds, granted and releasing, ascending.
func (t Table) HeldBy(holder string) (granted, releasing []int) {
	for i, s := range t.Slots {
		switch {
		case s.Holder != holder:
		case s.Releasing:
			releasing = append(releasing, i)
		default:
			granted = append(granted, i)
		}
	}
	return granted, releasing
}

// FromStatus returns the table a ring of count slots carries in its status
// (nil: a table not written yet). A slot listed twice, a slot outside the
// count, an empty or repeated instance name, or a release without a
// positive revision above the table's is an error: the sharder writes none
// of them, so somebody else wrote the status.
func FromStatus(count int, status *v1alpha1.SlotTable) (Table, error) {
	t := NewTable(count)
	if status == nil {
		return t, nil
	}
	t.Revision = status.Revision
	put := func(holder string, list string, releasing bool, since int64) error {
		slots, err := ParseList(list, count)
		if err != nil {
			return fmt.Errorf("slots of %s: %w", holder, err)
		}
		for _, slot := range slots {
			if t.Slots[slot].Holder != "" {
				return fmt.Errorf("slot %d is held by both %s and %s", slot, t.Slots[slot].Holder, holder)
			}
			t.Slots[slot] = Slot{Holder: holder, Releasing: releasing, Since: since}
		}
		return nil
	}
	seen := map[string]bool{}
	for _, h := range status.Instances {
		if h.Name == "" || seen[h.Name] {
			return Table{}, fmt.Errorf("instance name %q is empty or repeated", h.Name)
		}
		seen[h.Name] = true
		if err := put(h.Name, h.Granted, false, 0); err != nil {
			return Table{}, err
		}
		for _, r := range h.Releasing {
			if r.Revision < 1 || r.Revision > status.Revision {
				return Table{}, fmt.Errorf("release of %s at revision %d outside the table's revisions 1 to %d", h.Name, r.Revision, status.Revision)
			}
			if err := put(h.Name, r.Slots, true, r.Revision); err != nil {
				return Table{}, err
			}
		}
	}
	return t, nil
}

// Status returns t as the ring's status carries it: instances sorted by
// name, each with its granted slots and its releasing slots grouped by
// revision, ascending. FromStatus(len(t.Slots), t.Status()) equals t.
func (t Table) Status() *v1alpha1.SlotTable {
	type lists struct {
		granted   []int
		releasing map[int64][]int
	}
	byHolder := map[string]*lists{}
	for i, s := range t.Slots {
		if s.Holder == "" {
			continue
		}
		l := byHolder[s.Holder]
		if l == nil {
			l = &lists{releasing: map[int64][]int{}}
			byHolder[s.Holder] = l
		}
		if s.Releasing {
			l.releasing[s.Since] = append(l.releasing[s.Since], i)
		} else {
			l.granted = append(l.granted, i)
		}
	}
	out := &v1alpha1.SlotTable{Revision: t.Revision}
	for _, name := range slices.Sorted(maps.Keys(byHolder)) {
		l := byHolder[name]
		h := v1alpha1.SlotHolder{Name: name, Granted: FormatList(l.granted)}
		for _, rev := range slices.Sorted(maps.Keys(l.releasing)) {
			h.Releasing = append(h.Releasing, v1alpha1.SlotRelease{Revision: rev, Slots: FormatList(l.releasing[rev])})
		}
		out.Instances = append(out.Instances, h)
	}
	return out
}

// Unacknowledged is a need of Leaving: a holder lost a slot granted to it,
// which no acknowledgement allows.
const Unacknowledged int64 = -1

// Leaving returns, for every instance that holds a slot in old and not in
// next, what lets that slot go without two instances on it: the revision
// the instance must have acknowledged, the highest Since of its releasing
// slots that leave, or Unacknowledged when a slot granted to it leaves.
// Such a change is safe while the instance holds its Lease only when its
// acknowledgement reaches that revision; otherwise only while it does not
// hold its Lease (it is gone, and the sharder holds the Lease or nobody
// does). Instances that lose nothing are not in the map.
func Leaving(old, next Table) map[string]int64 {
	var out map[string]int64
	for i, s := range old.Slots {
		if s.Holder == "" || (i < len(next.Slots) && next.Slots[i].Holder == s.Holder) {
			continue
		}
		if out == nil {
			out = map[string]int64{}
		}
		need, seen := out[s.Holder]
		switch {
		case !s.Releasing:
			out[s.Holder] = Unacknowledged
		case !seen:
			out[s.Holder] = s.Since
		case need != Unacknowledged && s.Since > need:
			out[s.Holder] = s.Since
		}
	}
	return out
}
