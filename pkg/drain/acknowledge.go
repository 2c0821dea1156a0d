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

// Acknowledge is an instance's answer to a drain request: it removes both the
// shard label and the drain label of ring from obj, telling the sharder that
// this instance has stopped working on the object and it may be assigned
// elsewhere.
//
// The patch is a JSON merge patch of the two labels plus obj's
// resourceVersion, so the API server applies it only if the object has not
// changed since obj was read (optimistic locking). A conflict is returned as
// is (apierrors.IsConflict reports true): the caller reads the object again
// and decides anew, because the drain may have been withdrawn or the object
// reassigned in between.
//
// The caller must have finished every reconcile of the object before calling
// Acknowledge: once the labels are gone the sharder assigns the object to its
// new instance at once. On success obj is updated with the server's answer,
// so pass a copy, never an object from a cache.
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
// obj in ring: it removes the ring's shard and drain labels and carries obj's
// resourceVersion for optimistic locking. It is the building block for
// controllers built on plain client-go, which send it with their clientset:
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
	return LabelPatch(obj.GetResourceVersion(), map[string]*string{
		v1alpha1.ShardLabel(ring): nil,
		v1alpha1.DrainLabel(ring): nil,
	}), nil
}
