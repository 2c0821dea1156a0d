package slots

import (
	"encoding/json"
	"math/rand/v2"
	"strconv"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// randomTable returns a table of count slots over n instances, some slots
// unassigned and some releasing since earlier revisions.
func randomTable(rnd *rand.Rand, count, n int) Table {
	t := NewTable(count)
	t.Revision = 1 + rnd.Int64N(50)
	for i := range t.Slots {
		switch rnd.IntN(6) {
		case 0: // unassigned
		case 1:
			t.Slots[i] = Slot{Holder: "i-" + strconv.Itoa(rnd.IntN(n)), Releasing: true, Since: 1 + rnd.Int64N(t.Revision)}
		default:
			t.Slots[i] = Slot{Holder: "i-" + strconv.Itoa(rnd.IntN(n))}
		}
	}
	return t
}

func TestTableRoundTrip(t *testing.T) {
	g := NewWithT(t)
	rnd := rand.New(rand.NewPCG(7, 8))
	for range 200 {
		count := 1 + rnd.IntN(500)
		table := randomTable(rnd, count, 1+rnd.IntN(20))
		got, err := FromStatus(count, table.Status())
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(got).To(Equal(table))
	}
	empty, err := FromStatus(4, nil)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(empty).To(Equal(NewTable(4)))
}

func TestTableStatus(t *testing.T) {
	g := NewWithT(t)
	table := Table{Revision: 9, Slots: []Slot{
		{Holder: "b"}, {Holder: "b"}, {Holder: "a", Releasing: true, Since: 9}, {Holder: "a"},
		{}, {Holder: "a", Releasing: true, Since: 4}, {Holder: "a", Releasing: true, Since: 9},
	}}
	g.Expect(table.Status()).To(Equal(&v1alpha1.SlotTable{Revision: 9, Instances: []v1alpha1.SlotHolder{
		{Name: "a", Granted: "3", Releasing: []v1alpha1.SlotRelease{{Revision: 4, Slots: "5"}, {Revision: 9, Slots: "2,6"}}},
		{Name: "b", Granted: "0-1"},
	}}))
	granted, releasing := table.HeldBy("a")
	g.Expect(granted).To(Equal([]int{3}))
	g.Expect(releasing).To(Equal([]int{2, 5, 6}))
}

// TestTableRefused: tables the sharder never writes are errors.
func TestTableRefused(t *testing.T) {
	g := NewWithT(t)
	for name, status := range map[string]*v1alpha1.SlotTable{
		"slot held twice": {Revision: 1, Instances: []v1alpha1.SlotHolder{{Name: "a", Granted: "0-2"}, {Name: "b", Granted: "2"}}},
		"granted and releasing": {Revision: 2, Instances: []v1alpha1.SlotHolder{
			{Name: "a", Granted: "1", Releasing: []v1alpha1.SlotRelease{{Revision: 1, Slots: "1"}}},
		}},
		"slot beyond count":    {Revision: 1, Instances: []v1alpha1.SlotHolder{{Name: "a", Granted: "8"}}},
		"instance twice":       {Revision: 1, Instances: []v1alpha1.SlotHolder{{Name: "a", Granted: "1"}, {Name: "a", Granted: "2"}}},
		"no name":              {Revision: 1, Instances: []v1alpha1.SlotHolder{{Granted: "1"}}},
		"release from nowhere": {Revision: 3, Instances: []v1alpha1.SlotHolder{{Name: "a", Releasing: []v1alpha1.SlotRelease{{Revision: 0, Slots: "1"}}}}},
		"release from later":   {Revision: 3, Instances: []v1alpha1.SlotHolder{{Name: "a", Releasing: []v1alpha1.SlotRelease{{Revision: 4, Slots: "1"}}}}},
	} {
		_, err := FromStatus(8, status)
		g.Expect(err).To(HaveOccurred(), name)
	}
}

// TestStatusSize: the largest table, 16,384 slots over 1,000 instances,
// each instance's slots scattered as far as they go, stays near 125 KB of
// the ring's status, far below the API server's limit of an object.
func TestStatusSize(t *testing.T) {
	g := NewWithT(t)
	table := NewTable(v1alpha1.MaxSlotCount)
	for i := range table.Slots {
		table.Slots[i] = Slot{Holder: "instance-" + strconv.Itoa(1000+i%1000)}
	}
	data, err := json.Marshal(table.Status())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(len(data)).To(BeNumerically("<=", 130_000))
}

// TestLeaving: what each holder that loses slots must have acknowledged
// for the change to be safe while it runs.
func TestLeaving(t *testing.T) {
	g := NewWithT(t)
	old := NewTable(6)
	old.Revision = 9
	old.Slots[0] = Slot{Holder: "a"}
	old.Slots[1] = Slot{Holder: "a", Releasing: true, Since: 4}
	old.Slots[2] = Slot{Holder: "b", Releasing: true, Since: 7}
	old.Slots[3] = Slot{Holder: "b", Releasing: true, Since: 5}
	old.Slots[4] = Slot{Holder: "c"}
	old.Slots[5] = Slot{Holder: "c", Releasing: true, Since: 8}

	g.Expect(Leaving(old, old.Clone())).To(BeEmpty(), "nothing leaves")

	next := old.Clone()
	next.Revision = 10
	next.Slots[0] = Slot{Holder: "a", Releasing: true, Since: 10} // asked to release: still a's
	next.Slots[1] = Slot{Holder: "c"}                             // a's release of revision 4 passes on
	next.Slots[2] = Slot{}                                        // b's releases of revisions 7 and 5 end
	next.Slots[3] = Slot{Holder: "a"}
	next.Slots[4] = Slot{Holder: "a"} // c's granted slot: no acknowledgement allows it
	next.Slots[5] = Slot{}
	g.Expect(Leaving(old, next)).To(Equal(map[string]int64{"a": 4, "b": 7, "c": Unacknowledged}))
}
