package app

import (
	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/slots"
)

// SlotsReport summarizes the slot table of a ring of unit Slots, as its
// status holds it.
type SlotsReport struct {
	// Count is the ring's slot count.
	Count int `json:"count"`
	// Revision is the table's revision; 0 before the sharder wrote it.
	Revision int64 `json:"revision"`
	// Granted, Releasing and Unassigned count the slots granted to an
	// instance, asked to be released by their instance, and held by none.
	Granted    int `json:"granted"`
	Releasing  int `json:"releasing"`
	Unassigned int `json:"unassigned"`
	// Invalid says why the table cannot be read; the counts are then 0.
	Invalid string `json:"invalid,omitempty"`
}

// slotTable reads the slot table of a ring of unit Slots: its summary and,
// per instance, the slots granted to it and those it is releasing. It
// returns nil for a ring of unit Objects.
func slotTable(ring *v1alpha1.ControllerRing) (*SlotsReport, map[string][2]int) {
	if !ring.Spec.AssignsSlots() {
		return nil, nil
	}
	count := ring.Spec.EffectiveSlotCount()
	report := &SlotsReport{Count: count}
	table, err := slots.FromStatus(count, ring.Status.Slots)
	if err != nil {
		report.Invalid = err.Error()
		return report, nil
	}
	report.Revision = table.Revision
	perInstance := map[string][2]int{}
	for _, s := range table.Slots {
		switch {
		case s.Holder == "":
			report.Unassigned++
		case s.Releasing:
			report.Releasing++
			c := perInstance[s.Holder]
			c[1]++
			perInstance[s.Holder] = c
		default:
			report.Granted++
			c := perInstance[s.Holder]
			c[0]++
			perInstance[s.Holder] = c
		}
	}
	return report, perInstance
}

// addSlots fills in the slot table of a ring of unit Slots: its summary
// on r, each instance's slots on its report (an instance the table names
// that has no report is added, with the state of a holder without a
// Lease).
func addSlots(ring *v1alpha1.ControllerRing, r *RingReport, instances map[string]*InstanceReport) {
	report, perInstance := slotTable(ring)
	if report == nil {
		return
	}
	r.Slots = report
	for name, inst := range instances {
		c := perInstance[name]
		inst.Slots, inst.ReleasingSlots = &c[0], &c[1]
	}
	for name, c := range perInstance {
		if _, ok := instances[name]; !ok {
			instances[name] = &InstanceReport{Name: name, State: stateUnknownInstance, Slots: &c[0], ReleasingSlots: &c[1],
				Note: "holds slots but has no Lease in the ring"}
		}
	}
}
