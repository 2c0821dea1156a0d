package app

import (
	"cmp"
	"slices"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
)

// Where a ring's counts come from (RingReport.Source).
const (
	// sourceStatus: the ring's status, as the sharder last wrote it.
	sourceStatus = "status"
	// sourceLabels: counted by the command from the objects' labels
	// (--recount).
	sourceLabels = "labels"
)

// stateUnknownInstance marks objects labelled with an instance that has no
// Lease in the ring: they stay with nobody until the sharder moves them.
const stateUnknownInstance = "no-lease"

// StatusReport is the output of `sharder status`.
type StatusReport struct {
	// Time is when the report was made: Lease ages, and the states the
	// command computes itself, are relative to it.
	Time metav1.Time `json:"time"`
	// Rings are sorted by name.
	Rings []RingReport `json:"rings"`
}

// RingReport is one ring.
type RingReport struct {
	Name           string `json:"name"`
	Algorithm      string `json:"algorithm"`
	LeaseNamespace string `json:"leaseNamespace"`
	// DrainTimeout is the ring's drainTimeout (its default when unset).
	DrainTimeout metav1.Duration `json:"drainTimeout"`
	// Source says where the counts and states come from: "status" (the
	// ring's status as the sharder last wrote it) or "labels" (counted from
	// the objects' labels and the Leases by the command, with --recount).
	Source string `json:"source"`
	// Generation is the ring's metadata.generation, ObservedGeneration the
	// generation its status describes (0: no status written yet).
	Generation         int64 `json:"generation"`
	ObservedGeneration int64 `json:"observedGeneration"`
	// Ready is the status of the ring's Ready condition as the sharder last
	// wrote it ("Unknown" when absent), Reason and Message its reason and
	// message.
	Ready   string `json:"ready"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// Stale lists why the ring's status may be out of date (source
	// "status" only): no status written, a generation not yet observed, an
	// instance the status calls ready whose Lease has long expired.
	Stale []string `json:"stale,omitempty"`
	// Instances are the ring's instances, sorted by name, then (source
	// "labels") the instances objects are labelled with that have no Lease.
	Instances []InstanceReport `json:"instances"`
	// ReadyInstances counts instances in state ready.
	ReadyInstances int `json:"readyInstances"`
	// Objects counts main objects in the ring's namespaces.
	Objects int `json:"objects"`
	// Unassigned counts main objects without a shard label.
	Unassigned int `json:"unassigned"`
	// Drains counts main objects carrying the drain label (drains in flight).
	Drains int `json:"drains"`
	// ObjectsWithoutLease counts main objects labelled with an instance that
	// has no Lease in the ring: nobody reconciles them until the sharder
	// moves them.
	ObjectsWithoutLease int `json:"objectsWithoutLease,omitempty"`
	// DrainList lists the drains in flight one by one (with --drains only),
	// UnassignedList the objects without an assignment (with --unassigned
	// only), both listed from the labels when the command ran.
	DrainList      []DrainReport      `json:"drainList,omitzero"`
	UnassignedList []UnassignedReport `json:"unassignedList,omitzero"`
	// Slots summarizes the slot table of a ring of unit Slots (nil for a
	// ring of unit Objects, whose objects carry shard labels).
	Slots *SlotsReport `json:"slots,omitempty"`
	// Problems are what the command could not read (resources not served or
	// forbidden, Leases it may not list).
	Problems []string `json:"problems,omitempty"`
}

// InstanceReport is one instance of a ring.
type InstanceReport struct {
	Name string `json:"name"`
	// State is the instance's state: ready, restarting, expired, uncertain, vanished,
	// dead, orphaned or invalid; no-lease (source "labels") for an instance
	// only labels name.
	State string `json:"state"`
	// VirtualNodes is the instance's weight (the ring's default unless its
	// Lease says otherwise).
	VirtualNodes int `json:"virtualNodes"`
	// Objects counts main objects labelled with the instance.
	Objects int `json:"objects"`
	// Controlled counts controlled objects labelled with the instance, and
	// Drains the instance's main objects carrying the drain label. Both are
	// counted only from the labels (source "labels"); the ring's status does
	// not carry them.
	Controlled *int `json:"controlled,omitempty"`
	Drains     *int `json:"drains,omitempty"`
	// Slots and ReleasingSlots count the slots the ring's slot table grants
	// the instance and asks it to release (unit Slots only).
	Slots          *int `json:"slots,omitempty"`
	ReleasingSlots *int `json:"releasingSlots,omitempty"`
	// Holder is the Lease's holder identity (empty once released).
	Holder string `json:"holder,omitempty"`
	// RenewTime is the Lease's last renewal.
	RenewTime *metav1.MicroTime `json:"renewTime,omitempty"`
	// Note explains anything odd, e.g. a malformed weight label.
	Note string `json:"note,omitempty"`
}

// newRingReport returns the report of ring with what its spec and Ready
// condition say.
func newRingReport(ring *v1alpha1.ControllerRing, source string) RingReport {
	r := RingReport{
		Name:               ring.Name,
		Algorithm:          ring.Spec.EffectiveAlgorithm(),
		LeaseNamespace:     ring.Spec.LeaseNamespace,
		DrainTimeout:       metav1.Duration{Duration: ring.Spec.EffectiveDrainTimeout()},
		Source:             source,
		Generation:         ring.Generation,
		ObservedGeneration: ring.Status.ObservedGeneration,
		Ready:              string(metav1.ConditionUnknown),
	}
	if cond := meta.FindStatusCondition(ring.Status.Conditions, v1alpha1.ConditionReady); cond != nil {
		r.Ready, r.Reason, r.Message = string(cond.Status), cond.Reason, cond.Message
	}
	return r
}

func joinNotes(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + "; " + b
}

func countReady(instances []InstanceReport) int {
	n := 0
	for _, inst := range instances {
		if inst.State == string(membership.StateReady) {
			n++
		}
	}
	return n
}

// sortedInstances returns the instances with a Lease by name, then those
// without one by name.
func sortedInstances(instances map[string]*InstanceReport) []InstanceReport {
	out := make([]InstanceReport, 0, len(instances))
	for _, inst := range instances {
		out = append(out, *inst)
	}
	slices.SortFunc(out, func(a, b InstanceReport) int {
		aOrphan, bOrphan := a.State == stateUnknownInstance, b.State == stateUnknownInstance
		if aOrphan != bOrphan {
			if aOrphan {
				return 1
			}
			return -1
		}
		return cmp.Compare(a.Name, b.Name)
	})
	return out
}
