package slots

import (
	"strconv"
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/labels"
)

func TestAcknowledgement(t *testing.T) {
	g := NewWithT(t)
	value := FormatAcknowledgement("8f14e45f-ceea-467f-a9f3-5e0f2b3c1d2a", 42)
	g.Expect(value).To(Equal("8f14e45f-ceea-467f-a9f3-5e0f2b3c1d2a/42"))
	g.Expect(ParseAcknowledgement(value, "8f14e45f-ceea-467f-a9f3-5e0f2b3c1d2a")).To(Equal(int64(42)))
	for _, v := range []string{"", "42", "/42", "other-uid/42", "8f14e45f-ceea-467f-a9f3-5e0f2b3c1d2a/", "8f14e45f-ceea-467f-a9f3-5e0f2b3c1d2a/x", "8f14e45f-ceea-467f-a9f3-5e0f2b3c1d2a/-3"} {
		g.Expect(ParseAcknowledgement(v, "8f14e45f-ceea-467f-a9f3-5e0f2b3c1d2a")).To(BeZero(), "%q", v)
	}
}

// TestRecord: the record follows newer tables only, takes up granted slots
// only, and loses a slot as soon as it is releasing.
func TestRecord(t *testing.T) {
	g := NewWithT(t)
	table := Table{Revision: 3, Slots: []Slot{{Holder: "a"}, {Holder: "a"}, {Holder: "a", Releasing: true, Since: 2}, {Holder: "b"}}}
	r, gained, lost, ok := Record{}.Apply("a", table)
	g.Expect(ok).To(BeTrue())
	g.Expect(r).To(Equal(Record{Revision: 3, Slots: []int{0, 1}}))
	g.Expect(gained).To(Equal([]int{0, 1}))
	g.Expect(lost).To(BeEmpty())
	g.Expect(r.Holds(2)).To(BeFalse(), "a slot releasing from the instance is never taken up")

	stale := Table{Revision: 2, Slots: []Slot{{Holder: "a"}, {Holder: "a"}, {Holder: "a"}, {Holder: "a"}}}
	same, gained, lost, ok := r.Apply("a", stale)
	g.Expect(ok).To(BeFalse())
	g.Expect(same).To(Equal(r))
	g.Expect(gained).To(BeEmpty())
	g.Expect(lost).To(BeEmpty())

	moved := Table{Revision: 4, Slots: []Slot{{Holder: "a"}, {Holder: "a", Releasing: true, Since: 4}, {Holder: "b"}, {Holder: "a"}}}
	r, gained, lost, ok = r.Apply("a", moved)
	g.Expect(ok).To(BeTrue())
	g.Expect(r.Slots).To(Equal([]int{0, 3}))
	g.Expect(gained).To(Equal([]int{3}))
	g.Expect(lost).To(Equal([]int{1}))
}

// TestGroupSelectors: one selector per watch group, each selecting exactly
// the group's slots among the given ones.
func TestGroupSelectors(t *testing.T) {
	g := NewWithT(t)
	const count = 256 // groups of 4 slots
	selectors, err := GroupSelectors("slot.sharder.dev/widgets", []int{0, 3, 4, 9, 255}, count)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(selectors).To(HaveLen(4))
	g.Expect(selectors[0].String()).To(Equal("slot.sharder.dev/widgets in (0,3)"))
	for group, sel := range selectors {
		for slot := range count {
			want := Group(slot, count) == group && (slot == 0 || slot == 3 || slot == 4 || slot == 9 || slot == 255)
			g.Expect(sel.Matches(labels.Set{"slot.sharder.dev/widgets": strconv.Itoa(slot)})).To(Equal(want), "group %d slot %d", group, slot)
		}
	}
}
