package slottable_test

import (
	"context"
	"fmt"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/internal/fixture"
	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/sharder/slottable"
)

// TestTableNeverGoesBack: a table that someone set back (an older
// revision, status.slots removed, or the newest revision with other
// content) is neither decided on nor written on: the sharder writes the
// newest table it saw back, with the revision above every one seen, and
// reports it. Running instances ignore a table not newer than theirs, a new
// instance would apply it.
func TestTableNeverGoesBack(t *testing.T) {
	t.Parallel()
	for name, setBack := range map[string]func(newest int64) *v1alpha1.SlotTable{
		"an older revision": func(int64) *v1alpha1.SlotTable {
			// The table of revision 1, as an etcd restore brings it back.
			return &v1alpha1.SlotTable{Revision: 1, Instances: []v1alpha1.SlotHolder{{Name: "a", Granted: "0-15"}}}
		},
		"status.slots removed": func(int64) *v1alpha1.SlotTable { return nil },
		"the newest revision with other content": func(newest int64) *v1alpha1.SlotTable {
			return &v1alpha1.SlotTable{Revision: newest, Instances: []v1alpha1.SlotHolder{{Name: "a", Granted: "0-15"}}}
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			g := NewWithT(t)
			ring, ns := newRing(t, 16)
			createLease(t, ring.Name, ns, "a", 60)
			s := startSharder(t, ring.Name, ns, slottable.Options{})
			g.Eventually(tableOf(ring)).Should(Satisfy(balanced("a")))
			// b joins: a releases half of its slots, acknowledges, b gets them.
			createLease(t, ring.Name, ns, "b", 60)
			g.Eventually(func() int { return holdings(must(tableOf(ring)()))["a"].releasing }).Should(Equal(8))
			acknowledge(g, ring, ns, "a", must(tableOf(ring)()).Revision)
			g.Eventually(tableOf(ring)).Should(Satisfy(balanced("a", "b")))
			before := s.settled(g, ring, 0)
			newest := must(tableOf(ring)())
			g.Expect(newest.Revision).To(BeNumerically(">", 1))

			setTable(g, ring.Name, setBack(newest.Revision))

			restored := func(g Gomega) {
				tbl, err := tableOf(ring)()
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(tbl.Revision).To(Equal(newest.Revision+1), "the revision above every one seen")
				g.Expect(tbl.Slots).To(Equal(newest.Slots), "the newest table seen")
			}
			g.Eventually(restored).Should(Succeed())
			g.Consistently(restored).Should(Succeed())
			for _, w := range s.successful()[before:] {
				g.Expect(w.table.Revision).To(BeNumerically(">", newest.Revision), "a table written on one that went back")
			}
			g.Eventually(invalidTableEvents(ring)).Should(ContainElement(
				HaveField("Message", ContainSubstring(fmt.Sprintf("revision %d", newest.Revision+1)))))
		})
	}
}

// TestTableBelowAcknowledgement: a sharder that never saw the newest table
// (a new leader) learns its revision from an instance's acknowledgement: a
// table below it is left alone, not written, and reported, until someone
// writes a table above it, on which the sharder decides again.
func TestTableBelowAcknowledgement(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ring, ns := newRing(t, 16)
	older := &v1alpha1.SlotTable{Revision: 2, Instances: []v1alpha1.SlotHolder{{Name: "a", Granted: "0-15"}}}
	setTable(g, ring.Name, older)
	createLease(t, ring.Name, ns, "a", 60)
	createLease(t, ring.Name, ns, "b", 60)
	acknowledge(g, ring, ns, "a", 5)
	s := startSharder(t, ring.Name, ns, slottable.Options{})

	g.Consistently(func() (*v1alpha1.SlotTable, error) {
		r, err := getRing(ring.Name)
		return r.Status.Slots, err
	}).Should(Equal(older))
	g.Expect(s.successful()).To(BeEmpty())
	g.Eventually(invalidTableEvents(ring)).Should(ContainElement(
		HaveField("Message", And(ContainSubstring("revision 2"), ContainSubstring("revision 5"), ContainSubstring("instance a")))))

	// Set right (a table above the acknowledged revision): decided on.
	setTable(g, ring.Name, &v1alpha1.SlotTable{Revision: 6, Instances: []v1alpha1.SlotHolder{{Name: "a", Granted: "0-15"}}})
	g.Eventually(func(g Gomega) {
		tbl, err := tableOf(ring)()
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(tbl.Revision).To(Equal(int64(7)))
		g.Expect(holdings(tbl)).To(Equal(map[string]held{"a": {granted: 8, releasing: 8}}))
	}).Should(Succeed())
}

// TestRingCreatedAgain: a ring deleted and created again with the same name
// (a new UID) starts afresh: its table from revision 1, whatever the
// revisions of the ring before and the acknowledgements of them on the
// Leases.
func TestRingCreatedAgain(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ring, ns := newRing(t, 16)
	createLease(t, ring.Name, ns, "a", 60)
	createLease(t, ring.Name, ns, "b", 60)
	s := startSharder(t, ring.Name, ns, slottable.Options{})
	g.Eventually(tableOf(ring)).Should(Satisfy(balanced("a", "b")))
	s.settled(g, ring, 0)
	// The old ring's table went to revision 9, which a acknowledged.
	setTable(g, ring.Name, &v1alpha1.SlotTable{Revision: 9, Instances: must(tableOf(ring)()).Status().Instances})
	acknowledge(g, ring, ns, "a", 9)

	g.Expect(env().Client.Delete(context.Background(), ring)).To(Succeed())
	g.Eventually(func() bool { _, err := getRing(ring.Name); return apierrors.IsNotFound(err) }).Should(BeTrue())
	again := fixture.Ring(ring.Name, ns, nil, func(r *v1alpha1.ControllerRing) { r.Spec.Assignment = ring.Spec.Assignment })
	fixture.Create(t, env().Client, again)
	g.Expect(again.UID).NotTo(Equal(ring.UID))

	g.Eventually(tableOf(again)).Should(Satisfy(balanced("a", "b")))
	g.Expect(must(tableOf(again)()).Revision).To(BeNumerically("<=", 3), "the new ring's revisions start anew")
	g.Consistently(invalidTableEvents(again)).Should(BeEmpty())
}

// setTable writes table into ring's status.slots as someone other than the
// sharder would (nil removes it).
func setTable(g Gomega, ring string, table *v1alpha1.SlotTable) {
	patch := client.RawPatch(types.MergePatchType, mustJSON(map[string]any{"status": map[string]any{"slots": table}}))
	g.Expect(env().Client.Status().Patch(context.Background(), &v1alpha1.ControllerRing{ObjectMeta: metav1.ObjectMeta{Name: ring}}, patch)).To(Succeed())
}

// invalidTableEvents returns the InvalidSlotTable events of ring (its UID).
func invalidTableEvents(ring *v1alpha1.ControllerRing) func() ([]corev1.Event, error) {
	return func() ([]corev1.Event, error) {
		events := &corev1.EventList{}
		if err := env().Client.List(context.Background(), events); err != nil {
			return nil, err
		}
		var out []corev1.Event
		for _, e := range events.Items {
			if e.InvolvedObject.UID == ring.UID && e.Reason == slottable.ReasonInvalidSlotTable {
				out = append(out, e)
			}
		}
		return out, nil
	}
}
