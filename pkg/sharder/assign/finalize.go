package assign

import (
	"context"
	"fmt"
	"sync/atomic"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/pager"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// addFinalizer puts v1alpha1.FinalizerLabels on ring, before anything of
// it is labelled. A sharder that may not change rings (its ClusterRole
// predates the finalizer) assigns all the same: its ring then records an
// event saying that deleting it will leave its labels.
func (c *Controller) addFinalizer(ctx context.Context, ring *v1alpha1.ControllerRing) error {
	updated := ring.DeepCopy()
	if !controllerutil.AddFinalizer(updated, v1alpha1.FinalizerLabels) {
		return nil
	}
	err := c.patchRing(ctx, ring, updated)
	switch {
	case err == nil:
		*ring = *updated
		return nil
	case apierrors.IsForbidden(err):
		c.ringEvent(ring, corev1.EventTypeWarning, "FinalizerNotAdded",
			"Cannot add the finalizer %s (%v): deleting the ring will leave its labels on its objects. Grant the sharder update and patch on controllerrings.",
			v1alpha1.FinalizerLabels, err)
		return nil
	default:
		return fmt.Errorf("adding finalizer: %w", err)
	}
}

// finalize removes the ring's shard and drain labels (a ring of unit
// Slots: its slot label) from every object of its resources, then its finalizer, so that the ring goes: deleting a ring
// leaves no object drained, released by a forced move, or assigned to an
// instance of a ring that is gone, as `sharder uninstall` leaves none. The
// ring's machinery must be stopped already, so that nothing labels the
// objects meanwhile. A failure is returned, and the ring kept, until the
// next attempt removes every label.
func (c *Controller) finalize(ctx context.Context, ring *v1alpha1.ControllerRing) error {
	// The resources as the API server serves them now: the discovery cached
	// may name a version a CustomResourceDefinition no longer serves.
	c.mapper.Reset()
	var removed int64
	for _, gr := range append(ring.Spec.MainResources(), ring.Spec.ControlledResources()...) {
		res, problem := resolveResource(c.mapper, gr)
		if problem != nil {
			continue // not served: no object of it can carry a label
		}
		var n int64
		var err error
		if ring.Spec.AssignsSlots() {
			n, err = c.removeSlotLabels(ctx, ring.Name, res.gvr)
		} else {
			n, err = c.removeLabels(ctx, ring.Name, res.gvr)
		}
		removed += n
		if err != nil {
			c.ringEvent(ring, corev1.EventTypeWarning, "LabelsNotRemoved",
				"Cannot remove the ring's labels from %s, so the ring is kept: %v. Grant the sharder list and patch on it; or remove the finalizer %s from the ring and the labels yourself (sharder uninstall does both).",
				gr.String(), err, v1alpha1.FinalizerLabels)
			return fmt.Errorf("removing labels of %s: %w", gr, err)
		}
	}
	updated := ring.DeepCopy()
	if controllerutil.RemoveFinalizer(updated, v1alpha1.FinalizerLabels) {
		if err := c.patchRing(ctx, ring, updated); err != nil {
			return fmt.Errorf("removing finalizer: %w", err)
		}
	}
	c.ringEvent(ring, corev1.EventTypeNormal, "LabelsRemoved", "Removed the ring's labels from %d objects before it is deleted.", removed)
	return nil
}

// removeLabels removes the shard and drain labels of ring, and its drain
// start annotation, from every object of gvr carrying either label, and returns how many objects it changed.
func (c *Controller) removeLabels(ctx context.Context, ring string, gvr schema.GroupVersionResource) (int64, error) {
	shard, drainLabel := v1alpha1.ShardLabel(ring), v1alpha1.DrainLabel(ring)
	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:null},"labels":{%q:null,%q:null}}}`,
		v1alpha1.DrainStartedAnnotation(ring), shard, drainLabel)
	var removed int64
	// Objects with a shard label first: the second list then finds only the
	// drained objects without one (released by a forced move).
	for _, label := range []string{shard, drainLabel} {
		n, err := c.patchSelected(ctx, gvr, label, patch)
		removed += n
		if err != nil {
			return removed, err
		}
	}
	return removed, nil
}

// removeSlotLabels removes the slot label of ring from every object of gvr
// carrying it, and returns how many objects it changed. The labelled
// objects are in no cache of the sharder: they are listed from the API
// server, page by page. The slot label policy lets the sharder remove the
// label while the ring is being deleted.
func (c *Controller) removeSlotLabels(ctx context.Context, ring string, gvr schema.GroupVersionResource) (int64, error) {
	label := v1alpha1.SlotLabel(ring)
	return c.patchSelected(ctx, gvr, label, fmt.Appendf(nil, `{"metadata":{"labels":{%q:null}}}`, label))
}

// patchSelected applies patch to every object of gvr that matches selector,
// Options.Workers at a time, and returns how many it patched.
func (c *Controller) patchSelected(ctx context.Context, gvr schema.GroupVersionResource, selector string, patch []byte) (int64, error) {
	resources := c.meta.Resource(gvr)
	list := pager.New(func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		return resources.List(ctx, opts)
	})
	var patched atomic.Int64
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(c.opts.Workers)
	err := list.EachListItem(ctx, metav1.ListOptions{LabelSelector: selector}, func(obj runtime.Object) error {
		m, ok := obj.(*metav1.PartialObjectMetadata)
		if !ok {
			return fmt.Errorf("unexpected list item %T", obj)
		}
		g.Go(func() error {
			_, err := resources.Namespace(m.Namespace).Patch(ctx, m.Name, types.MergePatchType, patch,
				metav1.PatchOptions{FieldManager: c.opts.FieldManager})
			switch {
			case err == nil:
				patched.Add(1)
			case !apierrors.IsNotFound(err):
				return fmt.Errorf("patching %s/%s: %w", m.Namespace, m.Name, err)
			}
			return nil
		})
		return nil
	})
	if werr := g.Wait(); werr != nil {
		return patched.Load(), werr
	}
	if err != nil {
		return patched.Load(), fmt.Errorf("listing objects labelled %s: %w", selector, err)
	}
	return patched.Load(), nil
}

// patchRing writes the metadata of updated over ring, locked on ring's
// resourceVersion.
func (c *Controller) patchRing(ctx context.Context, ring, updated *v1alpha1.ControllerRing) error {
	opts := []client.PatchOption{}
	if c.opts.FieldManager != "" {
		opts = append(opts, client.FieldOwner(c.opts.FieldManager))
	}
	return c.client.Patch(ctx, updated, client.MergeFromWithOptions(ring, client.MergeFromWithOptimisticLock{}), opts...)
}

// ringEvent records an event on ring.
func (c *Controller) ringEvent(ring *v1alpha1.ControllerRing, eventType, reason, note string, args ...any) {
	ref := &v1alpha1.ControllerRing{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "ControllerRing"},
		ObjectMeta: metav1.ObjectMeta{Name: ring.Name, UID: ring.UID},
	}
	c.recorder.Eventf(ref, eventType, reason, note, args...)
}
