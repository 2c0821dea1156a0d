package drain

import (
	"context"
	"errors"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// ErrNotDraining is returned by Acknowledge and AcknowledgePatch for an
// object that carries no drain label of the ring: there is nothing to
// acknowledge, and removing the shard label alone is not an instance's call.
var ErrNotDraining = errors.New("object carries no drain label")

// Acknowledge is an instance's answer to a drain request: it tells the
// sharder that this instance has stopped working on obj. When the drain names
// the instance to move to (Target), the acknowledgement hands the object over:
// it sets the shard label of ring to that instance and removes the drain
// label, so that the move is done without the sharder writing again. A drain
// that names no target (NoTarget, written for objects with controlled objects
// and by older sharders) is acknowledged by removing both the shard and the
// drain label; the sharder then assigns the object.
//
// The patch is a JSON merge patch of the two labels plus obj's
// resourceVersion, so the API server applies it only if the object has not
// changed since obj was read (optimistic locking). A conflict is returned as
// is (apierrors.IsConflict reports true): the caller reads the object again
// and decides anew, because the drain may have been withdrawn or the object
// reassigned in between.
//
// The caller must have finished every reconcile of the object before calling
// Acknowledge: once the patch is applied the new instance may start on the
// object at once. On success obj is updated with the server's answer, so
// pass a copy, never an object from a cache.
//
// Acknowledge works with typed objects, unstructured objects and
// metav1.PartialObjectMetadata alike. It returns ErrNotDraining, without a
// request, when obj carries no drain label of ring.
func Acknowledge(ctx context.Context, c client.Client, obj client.Object, ring string) error {
	patch, err := AcknowledgePatch(obj, ring)
	if err != nil {
		return err
	}
	if err := c.Patch(ctx, obj, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("acknowledging drain of %s/%s for ring %s: %w", obj.GetNamespace(), obj.GetName(), ring, err)
	}
	return nil
}

// AcknowledgePatch returns the JSON merge patch that acknowledges the drain of
// obj in ring: it sets the ring's shard label to the drain's target and
// removes the drain label (Target), or, for a drain that names no target,
// removes both labels; it removes the drain's start annotation
// (v1alpha1.DrainStartedAnnotation) too; it carries obj's resourceVersion for optimistic
// locking. It is the building block for controllers built on plain
// client-go, which send it with their clientset:
//
//	patch, err := drain.AcknowledgePatch(obj, ring)
//	if err != nil { ... }
//	_, err = clientset.AppsV1().Deployments(obj.Namespace).Patch(ctx, obj.Name,
//		types.MergePatchType, patch, metav1.PatchOptions{})
//
// The same rules as for Acknowledge apply: finish every reconcile of the
// object first, and treat a conflict as "read again and decide anew".
// It returns ErrNotDraining when obj carries no drain label of ring, and an
// error when obj has no resourceVersion (it was not read from the server).
func AcknowledgePatch(obj metav1.Object, ring string) ([]byte, error) {
	if !Requested(obj, ring) {
		return nil, fmt.Errorf("acknowledging drain of %s/%s for ring %s: %w", obj.GetNamespace(), obj.GetName(), ring, ErrNotDraining)
	}
	if obj.GetResourceVersion() == "" {
		return nil, fmt.Errorf("acknowledging drain of %s/%s for ring %s: object has no resourceVersion", obj.GetNamespace(), obj.GetName(), ring)
	}
	var next *string // no target: remove the shard label too
	if target, ok := Target(obj, ring); ok {
		next = &target
	}
	labels := map[string]*string{
		v1alpha1.ShardLabel(ring): next,
		v1alpha1.DrainLabel(ring): nil,
	}
	// Removing an annotation the object does not carry changes nothing: the
	// patch removes it whether or not obj, perhaps read from a cache that
	// drops annotations, shows it.
	annotations := map[string]*string{v1alpha1.DrainStartedAnnotation(ring): nil}
	return MetadataPatch(obj.GetResourceVersion(), labels, annotations), nil
}
