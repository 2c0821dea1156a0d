package slottable

import (
	"context"
	"fmt"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/sharder/slotpolicy"
)

// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=validatingadmissionpolicybindings,verbs=get;create;update;patch;delete

// writeBinding creates or updates the ring's binding of the slot label
// policy (slotpolicy.Binding), once per generation of the ring in this
// process. It reads the binding from the API server, not a cache: the
// sharder watches no bindings.
func (c *Controller) writeBinding(ctx context.Context, ring *v1alpha1.ControllerRing, st *ringState) error {
	if st.binding == ring.Generation {
		return nil
	}
	want := slotpolicy.Binding(ring)
	have := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
	err := c.reader.Get(ctx, client.ObjectKeyFromObject(want), have)
	switch {
	case apierrors.IsNotFound(err):
		if err := c.client.Create(ctx, want); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating the slot label policy binding %s: %w", want.Name, err)
		}
	case err != nil:
		return fmt.Errorf("reading the slot label policy binding %s: %w", want.Name, err)
	case !equality.Semantic.DeepDerivative(want.Spec, have.Spec) || !equality.Semantic.DeepEqual(want.OwnerReferences, have.OwnerReferences):
		updated := have.DeepCopy()
		updated.Spec = want.Spec
		updated.OwnerReferences = want.OwnerReferences
		if err := c.client.Update(ctx, updated); err != nil {
			return fmt.Errorf("updating the slot label policy binding %s: %w", want.Name, err)
		}
	}
	st.binding = ring.Generation
	return nil
}
