package slots

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
)

// FormatAcknowledgement returns the value of an instance Lease's
// sharder.dev/slots-acknowledged annotation: the instance acknowledges the
// releases of revision of the slot table of the ring with UID ringUID.
func FormatAcknowledgement(ringUID types.UID, revision int64) string {
	return string(ringUID) + "/" + strconv.FormatInt(revision, 10)
}

// ParseAcknowledgement returns the revision an annotation value
// acknowledges for the ring with UID ringUID: 0 when the value is empty,
// malformed, or names another ring (one of the same name deleted and
// created again), so that it acknowledges nothing.
func ParseAcknowledgement(value string, ringUID types.UID) int64 {
	uid, rev, ok := strings.Cut(value, "/")
	if !ok || uid == "" || types.UID(uid) != ringUID {
		return 0
	}
	n, err := strconv.ParseInt(rev, 10, 64)
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// Record is an instance's own record of the slots it holds: what it admits
// reconciles for, whatever its cache still holds. It changes only with a
// table newer than the last it acted on, and takes up only slots granted to
// the instance, never one releasing from it, so that its acknowledgements
// stay true (docs/design.md §11).
type Record struct {
	// Revision is the revision of the last table the record acted on; 0
	// before the first.
	Revision int64
	// Slots are the slots the instance holds, ascending.
	Slots []int
}

// Holds reports whether the record holds slot.
func (r Record) Holds(slot int) bool {
	_, ok := slices.BinarySearch(r.Slots, slot)
	return ok
}

// Apply returns the record after the instance id saw table t, with the
// slots it gained (granted to it now and not held before) and those it lost
// (held before, no longer granted: releasing, or granted elsewhere). A
// table older than or as old as the record's changes nothing (ok false): a
// watch or a list served from a cache may be behind. The instance stops
// admitting reconciles of the lost slots at once, and acknowledges t's
// revision once none of theirs is in flight.
func (r Record) Apply(id string, t Table) (next Record, gained, lost []int, ok bool) {
	if t.Revision <= r.Revision {
		return r, nil, nil, false
	}
	granted, _ := t.HeldBy(id)
	for _, slot := range granted {
		if !r.Holds(slot) {
			gained = append(gained, slot)
		}
	}
	for _, slot := range r.Slots {
		if _, held := slices.BinarySearch(granted, slot); !held {
			lost = append(lost, slot)
		}
	}
	return Record{Revision: t.Revision, Slots: granted}, gained, lost, true
}

// GroupSelectors returns, per watch group holding any of slots (ascending,
// within [0, count)), the label selector of the group's slots on the
// ring's slot label: slot.sharder.dev/<ring> in (...). An instance runs one
// watch per resource and group, and replaces a group's watch when its
// slots in the group change.
func GroupSelectors(slotLabel string, slots []int, count int) (map[int]labels.Selector, error) {
	byGroup := map[int][]string{}
	for _, slot := range slots {
		group := Group(slot, count)
		byGroup[group] = append(byGroup[group], strconv.Itoa(slot))
	}
	out := make(map[int]labels.Selector, len(byGroup))
	for group, values := range byGroup {
		req, err := labels.NewRequirement(slotLabel, selection.In, values)
		if err != nil {
			return nil, fmt.Errorf("selector of slot group %d: %w", group, err)
		}
		out[group] = labels.NewSelector().Add(*req)
	}
	return out, nil
}
