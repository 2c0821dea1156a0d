package assign

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sharder-dev/sharder/pkg/drain"
	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/metrics"
	"github.com/sharder-dev/sharder/pkg/ring"
)

// objectKey is the hash key of a main object (DESIGN §4).
func objectKey(gk schema.GroupKind, namespace, name string) string {
	return ring.ObjectKey(gk.Group, gk.Kind, namespace, name)
}

// reconcile brings one main object and its controlled objects to the
// instance the ring wants. It returns when to look at the object again (a
// drain's deadline), zero for never.
func (r *runner) reconcile(ctx context.Context, it item) (time.Duration, error) {
	w := r.byGK[it.gk]
	if w == nil {
		return 0, nil
	}
	obj, ok := w.get(it.namespace, it.name)
	if !ok || r.stale(obj) {
		return 0, nil
	}
	if !r.selected(obj.Namespace) {
		r.seen.Delete(obj.UID) // its namespace left the ring
		return 0, nil
	}
	view, cfg := r.view.Load(), r.cfg.Load()
	if view == nil {
		return 0, nil
	}
	target, err := view.ring.Lookup(objectKey(it.gk, it.namespace, it.name))
	if errors.Is(err, ring.ErrNoInstance) {
		return 0, nil // no ready instance: nothing is assigned, nothing moves
	}
	if err != nil {
		return 0, fmt.Errorf("looking up instance: %w", err)
	}
	current := obj.Labels[r.shardLabel]
	draining := drain.Requested(obj, r.name)
	children := r.descendants(obj)
	now := r.c.opts.Clock.Now()

	if current == "" { // new, or its drain was acknowledged
		if err := r.move(ctx, w, obj, children, target); err != nil {
			return 0, err
		}
		seen, wasSeen := r.seen.LoadAndDelete(obj.UID)
		if d, ok := r.drains.End(obj.UID); ok {
			metrics.DrainDuration.WithLabelValues(r.name, metrics.DrainAcknowledged).Observe(d.Seconds())
			metrics.MovesTotal.WithLabelValues(r.name, metrics.MoveRebalance).Inc()
			return 0, nil
		}
		metrics.AssignmentsTotal.WithLabelValues(r.name).Inc()
		if wasSeen {
			metrics.AssignmentLatency.WithLabelValues(r.name).Observe(r.c.opts.Clock.Since(seen.(time.Time)).Seconds())
		}
		return 0, nil
	}
	r.seen.Delete(obj.UID)

	if current == target {
		if draining { // the ring changed back while draining: withdraw the drain
			if err := r.patchMain(ctx, w, obj, map[string]any{r.drainLabel: nil}); err != nil {
				return 0, err
			}
			r.drains.End(obj.UID)
		}
		return 0, r.labelChildren(ctx, children, current)
	}

	switch state, known := view.states[current]; {
	case !known || state == membership.StateDead || state == membership.StateOrphaned:
		// Nobody is left to race with: relabel at once.
		if err := r.move(ctx, w, obj, children, target); err != nil {
			return 0, err
		}
		r.drains.End(obj.UID)
		metrics.MovesTotal.WithLabelValues(r.name, metrics.MoveDead).Inc()
		return 0, nil

	case state == membership.StateReady:
		if err := r.labelChildren(ctx, children, current); err != nil {
			return 0, err
		}
		if !draining {
			exists, err := r.requestDrain(ctx, w, obj)
			if err != nil || !exists {
				return 0, err
			}
			r.drains.Begin(obj.UID)
			metrics.DrainsTotal.WithLabelValues(r.name).Inc()
			return cfg.drainTimeout, nil
		}
		if wait := r.drains.Deadline(obj.UID, cfg.drainTimeout).Sub(now); wait > 0 {
			return wait, nil
		}
		if err := r.move(ctx, w, obj, children, target); err != nil {
			return 0, err
		}
		if d, ok := r.drains.End(obj.UID); ok {
			metrics.DrainDuration.WithLabelValues(r.name, metrics.DrainForced).Observe(d.Seconds())
		}
		metrics.MovesTotal.WithLabelValues(r.name, metrics.MoveForced).Inc()
		r.logger.V(1).Info("Drain not acknowledged in time: moved", "namespace", obj.Namespace, "name", obj.Name, "from", current, "to", target)
		return 0, nil

	default:
		// Expired or uncertain: the instance may still be working. Nothing
		// moves until it is ready again or dead.
		return 0, r.labelChildren(ctx, children, current)
	}
}

// move labels the controlled objects, then the main object, with instance,
// removing any drain label.
func (r *runner) move(ctx context.Context, w *watched, obj *object, children []child, instance string) error {
	if err := r.labelChildren(ctx, children, instance); err != nil {
		return err
	}
	return r.patchMain(ctx, w, obj, map[string]any{r.shardLabel: instance, r.drainLabel: nil})
}

// labelChildren gives every controlled object the shard label instance and
// no drain label. Controlled objects follow their main object, so these
// patches carry no lock.
func (r *runner) labelChildren(ctx context.Context, children []child, instance string) error {
	for _, c := range children {
		if c.obj.Labels[r.shardLabel] == instance && !drain.Requested(c.obj, r.name) {
			continue
		}
		patch := map[string]any{"metadata": map[string]any{"labels": map[string]any{r.shardLabel: instance, r.drainLabel: nil}}}
		if _, err := r.patch(ctx, c.w, c.obj, patch); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("labelling controlled %s %s/%s: %w", c.w.res.gk.Kind, c.obj.Namespace, c.obj.Name, err)
		}
	}
	return nil
}

// patchMain writes labels on a main object, locked on the cached
// resourceVersion: a decision taken on a stale cache fails with a conflict.
func (r *runner) patchMain(ctx context.Context, w *watched, obj *object, labels map[string]any) error {
	patch := map[string]any{"metadata": map[string]any{"resourceVersion": obj.ResourceVersion, "labels": labels}}
	out, err := r.patch(ctx, w, obj, patch)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("labelling %s %s/%s: %w", w.res.gk.Kind, obj.Namespace, obj.Name, err)
	}
	r.noteWrite(obj.UID, out.ResourceVersion)
	return nil
}

// requestDrain sets the drain label, locked on the cached resourceVersion.
// It reports false when the object is gone.
func (r *runner) requestDrain(ctx context.Context, w *watched, obj *object) (bool, error) {
	out, err := r.patchBytes(ctx, w, obj, drain.RequestPatch(r.name, obj.ResourceVersion))
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("requesting drain of %s %s/%s: %w", w.res.gk.Kind, obj.Namespace, obj.Name, err)
	}
	r.noteWrite(obj.UID, out.ResourceVersion)
	return true, nil
}

func (r *runner) patch(ctx context.Context, w *watched, obj *object, patch map[string]any) (*metav1.PartialObjectMetadata, error) {
	data, err := json.Marshal(patch)
	if err != nil {
		return nil, err
	}
	return r.patchBytes(ctx, w, obj, data)
}

// patchBytes sends a JSON merge patch and records a Forbidden answer as a
// problem of the resource.
func (r *runner) patchBytes(ctx context.Context, w *watched, obj *object, data []byte) (*metav1.PartialObjectMetadata, error) {
	out, err := r.c.meta.Resource(w.res.gvr).Namespace(obj.Namespace).Patch(ctx, obj.Name, types.MergePatchType, data, metav1.PatchOptions{})
	switch {
	case err == nil:
		if w.patchErrSet() {
			w.setPatchErr(nil)
			r.triggerStatus()
		}
	case apierrors.IsForbidden(err):
		w.setPatchErr(err)
		r.triggerStatus()
	}
	return out, err
}

func (w *watched) patchErrSet() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.patchErr != nil
}
