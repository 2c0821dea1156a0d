package assign_test

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sharder-dev/sharder/internal/fixture"
	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/sharder/assign"
)

// TestStatusWriteReplacesTheStatusLockedOnItsVersion checks the ring
// status write against the API server: it sets the status it is given,
// fields left out included (they are removed), and a status computed from
// a ring that changed since is refused with a conflict, not written.
func TestStatusWriteReplacesTheStatusLockedOnItsVersion(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ctx := context.Background()
	name := "status-write"
	fixture.Create(t, env().Client, fixture.Ring(name, env().Namespace(t), nil))
	read := func() *v1alpha1.ControllerRing {
		ring := &v1alpha1.ControllerRing{}
		g.Expect(env().Client.Get(ctx, types.NamespacedName{Name: name}, ring)).To(Succeed())
		return ring
	}

	ring := read()
	status := &v1alpha1.ControllerRingStatus{
		ObservedGeneration: ring.Generation,
		Members:            []v1alpha1.MemberStatus{{Name: "a", State: "ready", Objects: 3}, {Name: "b", State: "ready", Objects: 4}},
		Conditions: []metav1.Condition{{
			Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Test", Message: "set by the test",
			LastTransitionTime: metav1.Now().Rfc3339Copy(), ObservedGeneration: ring.Generation,
		}},
	}
	g.Expect(assign.PatchStatus(ctx, env().Client, ring, status, "test")).To(Succeed())
	written := read()
	g.Expect(written.Status.Members).To(Equal(status.Members))
	g.Expect(written.Status.Conditions).To(HaveLen(1))

	// Fields left out are removed: the status is set, not merged.
	smaller := &v1alpha1.ControllerRingStatus{ObservedGeneration: ring.Generation, Members: status.Members[:1]}
	g.Expect(assign.PatchStatus(ctx, env().Client, written, smaller, "test")).To(Succeed())
	g.Expect(read().Status.Members).To(Equal(smaller.Members))
	g.Expect(read().Status.Conditions).To(BeEmpty())

	// A status computed from the ring as it was before the last write.
	stale := &v1alpha1.ControllerRingStatus{ObservedGeneration: ring.Generation, Members: []v1alpha1.MemberStatus{{Name: "c", State: "ready", Objects: 7}}}
	err := assign.PatchStatus(ctx, env().Client, written, stale, "test")
	g.Expect(apierrors.IsConflict(err)).To(BeTrue(), "a write from a stale ring must conflict, got %v", err)
	g.Expect(read().Status.Members).To(Equal(smaller.Members), "the stale write changed nothing")
}
