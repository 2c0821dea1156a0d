package app

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
)

// readStatus makes the report of rings from their status and Leases. It
// lists no object: per ring it lists only the ring's Leases.
func readStatus(ctx context.Context, c client.Client, rings []v1alpha1.ControllerRing, now time.Time) (*StatusReport, error) {
	report := &StatusReport{Time: metav1.NewTime(now), Rings: []RingReport{}}
	for i := range rings {
		ring := &rings[i]
		r := newRingReport(ring, sourceStatus)
		leases, err := leasesOf(ctx, c, ring)
		if err != nil {
			if ctx.Err() != nil {
				return nil, err
			}
			r.Problems = append(r.Problems, err.Error()+" (instances are shown from the status alone)")
		}
		instances := instancesFromStatus(ring, leases, err == nil, now, &r)
		addSlots(ring, &r, instances)
		r.Instances = sortedInstances(instances)
		r.ReadyInstances = countReady(r.Instances)
		report.Rings = append(report.Rings, r)
	}
	slices.SortFunc(report.Rings, func(a, b RingReport) int { return cmp.Compare(a.Name, b.Name) })
	return report, nil
}

// instancesFromStatus returns the ring's members as its status lists them,
// with their Leases' holder and renewal, and the Leases the status does not
// list. It fills r's counts and the reasons the status may be stale; only
// when haveLeases (the Leases could be listed) does it judge the members by
// their Leases.
func instancesFromStatus(ring *v1alpha1.ControllerRing, leases []coordinationv1.Lease, haveLeases bool, now time.Time, r *RingReport) map[string]*InstanceReport {
	st := &ring.Status
	switch {
	case st.ObservedGeneration == 0: // the sharder writes it with every status; generations start at 1
		r.Stale = append(r.Stale, "the sharder has not written the ring's status yet")
	case st.ObservedGeneration < ring.Generation:
		r.Stale = append(r.Stale, fmt.Sprintf("the status describes generation %d of the ring, which is at generation %d",
			st.ObservedGeneration, ring.Generation))
	}
	r.Objects, r.Unassigned, r.Drains = int(st.Objects), int(st.UnassignedObjects), int(st.Drains)

	byName := make(map[string]*coordinationv1.Lease, len(leases))
	for i := range leases {
		byName[leases[i].Name] = &leases[i]
	}
	instances := make(map[string]*InstanceReport, len(st.Members)+len(leases))
	held := 0
	for _, m := range st.Members {
		inst := &InstanceReport{Name: m.Name, State: m.State, VirtualNodes: int(m.VirtualNodes), Objects: int(m.Objects)}
		held += inst.Objects
		instances[m.Name] = inst
		lease, ok := byName[m.Name]
		if !haveLeases {
			continue
		}
		if !ok {
			inst.Note = "no Lease in the ring"
			if m.State == string(membership.StateReady) {
				r.Stale = append(r.Stale, fmt.Sprintf("the status says instance %s is ready, but it has no Lease in the ring", m.Name))
			}
			continue
		}
		inst.Holder, inst.RenewTime = ptr.Deref(lease.Spec.HolderIdentity, ""), lease.Spec.RenewTime
		inst.Note = leaseNote(lease)
		if m.State == string(membership.StateReady) {
			t, d := membership.ReferenceTime(lease), membership.DurationOf(lease)
			if since := now.Sub(t); since >= 2*d {
				r.Stale = append(r.Stale, fmt.Sprintf("the status says instance %s is ready, but its Lease was last renewed %s ago (lease duration %s)",
					m.Name, duration.HumanDuration(since), d))
			}
		}
	}
	for i := range leases {
		lease := &leases[i]
		if _, ok := instances[lease.Name]; ok {
			continue
		}
		inst := leaseInstance(ring, lease, now)
		inst.Note = joinNotes("not in the ring's status: state computed from the Lease", inst.Note)
		instances[lease.Name] = inst
	}
	if n := r.Objects - r.Unassigned - held; n > 0 {
		r.ObjectsWithoutLease = n
	}
	return instances
}

// leasesOf lists the ring's instance Leases.
func leasesOf(ctx context.Context, c client.Client, ring *v1alpha1.ControllerRing) ([]coordinationv1.Lease, error) {
	list := &coordinationv1.LeaseList{}
	if err := c.List(ctx, list, client.InNamespace(ring.Spec.LeaseNamespace), client.MatchingLabels{v1alpha1.LabelRing: ring.Name}); err != nil {
		return nil, fmt.Errorf("listing the Leases of ring %s in namespace %s: %w", ring.Name, ring.Spec.LeaseNamespace, err)
	}
	return list.Items, nil
}

// leaseInstance returns the instance of lease with the state the command
// computes from the Lease alone (membership.StateOf) and its weight.
func leaseInstance(ring *v1alpha1.ControllerRing, lease *coordinationv1.Lease, now time.Time) *InstanceReport {
	state, _ := membership.StateOf(lease, now)
	inst := &InstanceReport{
		Name:         lease.Name,
		State:        string(state),
		VirtualNodes: ring.Spec.EffectiveVirtualNodes(),
		Holder:       ptr.Deref(lease.Spec.HolderIdentity, ""),
		RenewTime:    lease.Spec.RenewTime,
		Note:         leaseNote(lease),
	}
	if weight, err := membership.VirtualNodesOf(lease); err == nil && weight > 0 {
		inst.VirtualNodes = weight
	}
	return inst
}

// leaseNote says what is odd about a Lease: who holds it when its instance
// does not, a malformed weight label.
func leaseNote(lease *coordinationv1.Lease) string {
	var note string
	switch holder := ptr.Deref(lease.Spec.HolderIdentity, ""); {
	case holder == "":
		note = "Lease released"
	case holder != lease.Name:
		note = "Lease held by " + holder
	}
	if _, err := membership.VirtualNodesOf(lease); err != nil {
		note = joinNotes(note, err.Error()+" (the ring's default weight applies)")
	}
	return note
}
