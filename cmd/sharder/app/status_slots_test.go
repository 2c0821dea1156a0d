package app

import (
	"bytes"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// TestStatusSlotRing: the report of a ring of unit Slots carries its slot
// table's summary and each instance's granted and releasing slots, and the
// table shows them instead of object counts.
func TestStatusSlotRing(t *testing.T) {
	g := NewWithT(t)
	ring := &v1alpha1.ControllerRing{
		ObjectMeta: metav1.ObjectMeta{Name: "widgets", Generation: 2},
		Spec: v1alpha1.ControllerRingSpec{
			LeaseNamespace: "widget-system",
			Assignment: &v1alpha1.RingAssignment{Unit: v1alpha1.AssignmentUnitSlots,
				Slots: &v1alpha1.RingSlots{Count: 8}},
		},
		Status: v1alpha1.ControllerRingStatus{
			ObservedGeneration: 2,
			UnassignedObjects:  3,
			Members: []v1alpha1.MemberStatus{
				{Name: "a", State: "ready", VirtualNodes: 100, Slots: 3},
				{Name: "b", State: "ready", VirtualNodes: 100, Slots: 2},
			},
			Slots: &v1alpha1.SlotTable{Revision: 7, Instances: []v1alpha1.SlotHolder{
				{Name: "a", Granted: "0-2", Releasing: []v1alpha1.SlotRelease{{Revision: 7, Slots: "3"}}},
				{Name: "b", Granted: "4-5"},
				{Name: "gone", Granted: "6"},
			}},
		},
	}
	r := newRingReport(ring, sourceStatus)
	instances := instancesFromStatus(ring, nil, false, time.Now(), &r)
	addSlots(ring, &r, instances)
	r.Instances = sortedInstances(instances)
	r.ReadyInstances = countReady(r.Instances)

	g.Expect(r.Slots).To(Equal(&SlotsReport{Count: 8, Revision: 7, Granted: 6, Releasing: 1, Unassigned: 1}))
	slotsOf := map[string][2]int{}
	for _, inst := range r.Instances {
		g.Expect(inst.Slots).NotTo(BeNil(), inst.Name)
		slotsOf[inst.Name] = [2]int{*inst.Slots, *inst.ReleasingSlots}
	}
	g.Expect(slotsOf).To(Equal(map[string][2]int{"a": {3, 1}, "b": {2, 0}, "gone": {1, 0}}))

	var out bytes.Buffer
	g.Expect(writeStatusTable(&out, &StatusReport{Rings: []RingReport{r}})).To(Succeed())
	lines := strings.Split(out.String(), "\n")
	g.Expect(lines[1]).To(Equal("  3 instances (2 ready), 3 objects without a slot label"))
	g.Expect(lines[2]).To(Equal("  slot table: revision 7, 8 slots: 6 granted, 1 releasing, 1 unassigned"))
	g.Expect(out.String()).To(MatchRegexp(`(?m)^\s+INSTANCE\s+STATE\s+WEIGHT\s+SLOTS\s+RELEASING\s+RENEWED\s+NOTE$`))
	g.Expect(out.String()).To(MatchRegexp(`(?m)^\s+a\s+ready\s+100\s+3\s+1\s+-\s*$`))
	g.Expect(out.String()).To(MatchRegexp(`(?m)^\s+gone\s+no-lease\s+-\s+1\s+0\s+-\s+holds slots but has no Lease in the ring$`))
}
