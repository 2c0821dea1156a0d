package config_test

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// slotRing returns a ring with the given spec.assignment (none when nil).
func slotRing(name string, assignment map[string]any) *unstructured.Unstructured {
	spec := map[string]any{
		"leaseNamespace": "default",
		"resources":      []any{map[string]any{"resource": "configmaps"}},
	}
	if assignment != nil {
		spec["assignment"] = assignment
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "sharder.dev/v1alpha1",
		"kind":       "ControllerRing",
		"metadata":   map[string]any{"name": name},
		"spec":       spec,
	}}
}

// createRing creates ring for the rest of the test and returns it as stored.
func createRing(t *testing.T, ring *unstructured.Unstructured) *unstructured.Unstructured {
	t.Helper()
	ctx := context.Background()
	if err := env().Client.Create(ctx, ring); err != nil {
		t.Fatalf("creating ring %s: %v", ring.GetName(), err)
	}
	t.Cleanup(func() {
		if err := env().Client.Delete(ctx, ring); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting ring %s: %v", ring.GetName(), err)
		}
	})
	return ring
}

// patchRing merge-patches the spec of the ring called name.
func patchRing(name, patch string) error {
	ring := slotRing(name, nil)
	return env().Client.Patch(context.Background(), ring, client.RawPatch(types.MergePatchType, []byte(patch)))
}

// TestSlotAssignmentDefaults: the API server fills in unit Objects where a
// ring sets an assignment without a unit, and a slot ring's count and key
// where it sets slots without them; a ring without an assignment stays
// without one (object mode).
func TestSlotAssignmentDefaults(t *testing.T) {
	g := NewWithT(t)
	plain := createRing(t, slotRing("slots-defaults-plain", nil))
	g.Expect(plain.Object["spec"]).NotTo(HaveKey("assignment"))

	watch := createRing(t, slotRing("slots-defaults-watch", map[string]any{"mode": "Watch"}))
	unit, _, _ := unstructured.NestedString(watch.Object, "spec", "assignment", "unit")
	g.Expect(unit).To(Equal("Objects"))

	slots := createRing(t, slotRing("slots-defaults-slots", map[string]any{"unit": "Slots", "slots": map[string]any{}}))
	count, _, _ := unstructured.NestedInt64(slots.Object, "spec", "assignment", "slots", "count")
	key, _, _ := unstructured.NestedString(slots.Object, "spec", "assignment", "slots", "key")
	mode, _, _ := unstructured.NestedString(slots.Object, "spec", "assignment", "mode")
	g.Expect(count).To(Equal(int64(256)))
	g.Expect(key).To(Equal("Object"))
	g.Expect(mode).To(Equal("Watch"))
}

// TestSlotAssignmentRefused: values outside the API are refused at
// creation, each with a message naming what is wrong.
func TestSlotAssignmentRefused(t *testing.T) {
	g := NewWithT(t)
	for name, tc := range map[string]struct {
		assignment map[string]any
		message    string
	}{
		"unknown-unit":  {map[string]any{"unit": "Shards"}, `spec.assignment.unit: Unsupported value: "Shards"`},
		"zero-count":    {map[string]any{"unit": "Slots", "slots": map[string]any{"count": 0}}, "spec.assignment.slots.count: Invalid value: 0"},
		"too-many":      {map[string]any{"unit": "Slots", "slots": map[string]any{"count": 16385}}, "spec.assignment.slots.count: Invalid value: 16385"},
		"unknown-key":   {map[string]any{"unit": "Slots", "slots": map[string]any{"key": "UID"}}, `spec.assignment.slots.key: Unsupported value: "UID"`},
		"slots-objects": {map[string]any{"unit": "Objects", "slots": map[string]any{"count": 64}}, "spec.assignment.slots applies to unit Slots only"},
		"slots-no-unit": {map[string]any{"slots": map[string]any{"count": 64}}, "spec.assignment.slots applies to unit Slots only"},
	} {
		err := env().Client.Create(context.Background(), slotRing("slots-refused-"+name, tc.assignment), client.DryRunAll)
		g.Expect(err).To(MatchError(ContainSubstring(tc.message)), name)
	}
	for _, count := range []int{1, 16384} {
		ring := slotRing("slots-accepted", map[string]any{"unit": "Slots", "slots": map[string]any{"count": count, "key": "Namespace"}})
		g.Expect(env().Client.Create(context.Background(), ring, client.DryRunAll)).To(Succeed(), "count %d", count)
	}
}

// TestSlotAssignmentFixed: a ring's unit, slot count and slot key never
// change after its creation, whether a change spells the default out or
// leaves it implicit; the rest of the spec still changes.
func TestSlotAssignmentFixed(t *testing.T) {
	g := NewWithT(t)
	createRing(t, slotRing("slots-fixed-objects", nil))
	createRing(t, slotRing("slots-fixed-slots", map[string]any{"unit": "Slots"}))
	createRing(t, slotRing("slots-fixed-count", map[string]any{"unit": "Slots", "slots": map[string]any{"count": 1024, "key": "Namespace"}}))

	for _, tc := range []struct{ ring, patch, message string }{
		{"slots-fixed-objects", `{"spec":{"assignment":{"unit":"Slots"}}}`, "spec.assignment.unit cannot change"},
		{"slots-fixed-slots", `{"spec":{"assignment":{"unit":"Objects"}}}`, "spec.assignment.unit cannot change"},
		{"slots-fixed-slots", `{"spec":{"assignment":null}}`, "spec.assignment.unit cannot change"},
		{"slots-fixed-slots", `{"spec":{"assignment":{"slots":{"count":512}}}}`, "spec.assignment.slots.count cannot change"},
		{"slots-fixed-slots", `{"spec":{"assignment":{"slots":{"key":"Namespace"}}}}`, "spec.assignment.slots.key cannot change"},
		{"slots-fixed-count", `{"spec":{"assignment":{"slots":{"count":2048}}}}`, "spec.assignment.slots.count cannot change"},
		{"slots-fixed-count", `{"spec":{"assignment":{"slots":null}}}`, "spec.assignment.slots.count cannot change"},
		{"slots-fixed-count", `{"spec":{"assignment":{"slots":{"key":"Object"}}}}`, "spec.assignment.slots.key cannot change"},
	} {
		g.Expect(patchRing(tc.ring, tc.patch)).To(MatchError(ContainSubstring(tc.message)), "%s %s", tc.ring, tc.patch)
	}
	for _, tc := range []struct{ ring, patch string }{
		{"slots-fixed-objects", `{"spec":{"assignment":{"mode":"Admission","unit":"Objects"}}}`},
		{"slots-fixed-slots", `{"spec":{"assignment":{"mode":"Admission","slots":{"count":256,"key":"Object"}}}}`},
		{"slots-fixed-count", `{"spec":{"drainTimeout":"45s","assignment":{"mode":"Admission"}}}`},
	} {
		g.Expect(patchRing(tc.ring, tc.patch)).To(Succeed(), "%s %s", tc.ring, tc.patch)
	}
}
