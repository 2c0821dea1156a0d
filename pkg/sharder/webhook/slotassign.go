package webhook

import (
	"context"
	"fmt"
	"strconv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/slots"
)

// chooseSlot returns the slot label a new object of a ring of unit Slots
// is created with (docs/design.md §11, "Who writes the slot label"): a
// main object's slot, a function of its key and the ring's slot count
// alone; a controlled object's controller's slot label, when the
// controller carries one. None, with why, for a main object whose name is
// still to be generated and a controlled object whose controller is not
// labelled yet: the sharder's slot labeler labels them from its watch.
func (h *labelHandler) chooseSlot(ctx context.Context, rg *v1alpha1.ControllerRing, gvr metav1.GroupVersionResource, gvk metav1.GroupVersionKind,
	obj *metav1.PartialObjectMetadata) (string, string, error) {
	gr := schema.GroupResource{Group: gvr.Group, Resource: gvr.Resource}
	switch {
	case rg.Spec.IsMainResource(gr):
		if obj.Name == "" {
			return "", "the object has no name yet", nil
		}
		return strconv.Itoa(slots.ForMainObject(&rg.Spec, gvk.Group, gvk.Kind, obj.Namespace, obj.Name)), "", nil
	case rg.Spec.IsControlledResource(gr):
		value, why, err := h.controllerLabel(ctx, rg, obj, v1alpha1.SlotLabel(rg.Name), "has no slot label yet")
		if err != nil || value == "" {
			return "", why, err
		}
		if _, perr := slots.ParseLabel(value, rg.Spec.EffectiveSlotCount()); perr != nil {
			// Left to the labeler, which reports the controller.
			return "", fmt.Sprintf("its controller's slot label names no slot of the ring: %v", perr), nil
		}
		return value, "", nil
	}
	return "", fmt.Sprintf("%s is not a resource of the ring", gr), nil
}
