package assign

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sync/errgroup"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/drain"
	"github.com/sharder-dev/sharder/pkg/ring"
	"github.com/sharder-dev/sharder/pkg/sharder/assign/internal/metacache"
	"github.com/sharder-dev/sharder/pkg/sharder/metrics"
)

// reconcile brings one main object and its controlled objects to the
// instance the ring wants: it decides, acts, and records what it did. It
// returns when to look at the object again (a drain's deadline, the end of
// a hold), zero for never.
func (r *ringAssigner) reconcile(ctx context.Context, it item) (time.Duration, error) {
	w := it.res
	obj, ok := w.cache.Get(it.namespace, it.name)
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
	s, err := r.situation(view, cfg, w.res.gk, obj)
	if err != nil {
		return 0, err
	}
	d := decide(s)
	if err := r.act(ctx, w, obj, s, d); err != nil {
		if errors.Is(err, errGone) {
			return 0, nil // deleted meanwhile: its deletion ends everything
		}
		if errors.Is(err, errNotMovable) {
			// The hold ended after this view was built: decided again on
			// the membership that says so.
			return notMovableRetry, nil
		}
		return 0, err
	}
	r.record(obj, s, d)
	if d.at.IsZero() {
		return 0, nil
	}
	return max(d.at.Sub(s.now), time.Nanosecond), nil
}

// situation gathers what the decision about obj depends on.
func (r *ringAssigner) situation(view *ringView, cfg *ringConfig, gk schema.GroupKind, obj *metacache.Object) (situation, error) {
	s := situation{
		current:      obj.Labels[r.shardLabel],
		draining:     drain.Requested(obj, r.name),
		drainTimeout: cfg.drainTimeout,
		now:          r.c.opts.Clock.Now(),
	}
	target, err := ring.LookupObject(view.ring, gk.Group, gk.Kind, obj.Namespace, obj.Name)
	switch {
	case errors.Is(err, ring.ErrNoInstance):
	case err != nil:
		return s, fmt.Errorf("looking up instance: %w", err)
	default:
		s.target = target
	}
	if s.current != "" {
		s.state, s.movable, s.heldUntil = view.stateOf(s.current, s.now)
		s.currentPromise = promiseOf(view.states[s.current])
	}
	if s.draining {
		s.drainStarted = r.drainStarted(obj, s.now, cfg.drainTimeout)
		s.drainTarget, _ = drain.Target(obj, r.name)
		if s.current == "" {
			// Released by a forced move: which instance it left is not on
			// the object; unless the sharder recorded it, every member's
			// promise counts.
			s.releasedAt, s.releaseGrace = r.drains.Released(obj.UID, ForceGrace+view.maxPromise)
		}
	}
	return s, nil
}

// act carries out decision d about obj.
func (r *ringAssigner) act(ctx context.Context, w *resourceCache, obj *metacache.Object, s situation, d decision) error {
	children := r.descendants(obj)
	switch d.action {
	case actionRelabelGone:
		// Counted in flight until the writes return: the lease controller
		// releases the instance's Lease only after that.
		done, ok := r.c.opts.Registry.BeginMove(r.name, s.current)
		if !ok {
			return errNotMovable
		}
		defer done()
		return r.move(ctx, w, obj, children, s.target)
	case actionAssign, actionAssignForced:
		return r.move(ctx, w, obj, children, s.target)
	case actionForce:
		// The drain label and its start stay: the object is released.
		return r.patchMain(ctx, w, obj, map[string]*string{r.shardLabel: nil}, nil)
	case actionRequestDrain, actionRetarget:
		if err := r.labelChildren(ctx, children, s.current); err != nil {
			return err
		}
		// The drain names the target, so that the acknowledgement hands the
		// object over, unless controlled objects must move first: those the
		// sharder moves once the acknowledgement removed both labels.
		target := s.target
		if len(children) > 0 {
			target = ""
		}
		return r.requestDrain(ctx, w, obj, target, s.drainStartedOrNow())
	case actionWithdraw:
		if err := r.patchMain(ctx, w, obj, map[string]*string{r.drainLabel: nil}, r.noDrainStart()); err != nil {
			return err
		}
		return r.labelChildren(ctx, children, s.current)
	case actionKeep, actionWait, actionHold:
		if s.current == "" {
			return nil
		}
		return r.labelChildren(ctx, children, s.current)
	}
	return nil
}

// record updates the drain tracker, the first-seen times and the metrics
// after decision d about obj was carried out.
func (r *ringAssigner) record(obj *metacache.Object, s situation, d decision) {
	if s.current != "" {
		r.seen.Delete(obj.UID)
		if !s.draining {
			// A drain that ended with the object on an instance: the
			// acknowledgement handed it over to the drain's target.
			if took, ok := r.drains.End(obj.UID); ok {
				metrics.DrainDuration.WithLabelValues(r.name, metrics.DrainAcknowledged).Observe(took.Seconds())
				metrics.MovesTotal.WithLabelValues(r.name, metrics.MoveRebalance).Inc()
			}
		}
	}
	switch d.action {
	case actionAssign:
		seen, wasSeen := r.seen.LoadAndDelete(obj.UID)
		if took, ok := r.drains.End(obj.UID); ok {
			metrics.DrainDuration.WithLabelValues(r.name, metrics.DrainAcknowledged).Observe(took.Seconds())
			metrics.MovesTotal.WithLabelValues(r.name, metrics.MoveRebalance).Inc()
			return
		}
		metrics.AssignmentsTotal.WithLabelValues(r.name).Inc()
		if wasSeen {
			metrics.AssignmentLatency.WithLabelValues(r.name).Observe(r.c.opts.Clock.Since(seen.(time.Time)).Seconds())
		}
	case actionRelabelGone:
		r.drains.End(obj.UID)
		metrics.MovesTotal.WithLabelValues(r.name, metrics.MoveDead).Inc()
	case actionRequestDrain:
		r.drains.BeginAt(obj.UID, s.now)
		metrics.DrainsTotal.WithLabelValues(r.name).Inc()
	case actionWait, actionRetarget:
		r.drains.BeginAt(obj.UID, s.drainStartedOrNow())
	case actionForce:
		grace := ForceGrace + s.currentPromise
		r.drains.Release(obj.UID, grace)
		r.logger.V(1).Info("Drain not acknowledged in time: released the object from its instance", "object", klog.KObj(obj), "from", s.current, "assignAfter", grace)
	case actionAssignForced:
		if took, ok := r.drains.End(obj.UID); ok {
			metrics.DrainDuration.WithLabelValues(r.name, metrics.DrainForced).Observe(took.Seconds())
		}
		metrics.MovesTotal.WithLabelValues(r.name, metrics.MoveForced).Inc()
		r.logger.V(1).Info("Assigned an object released by a forced move", "object", klog.KObj(obj), "to", s.target)
	case actionWithdraw:
		r.drains.End(obj.UID)
	}
}

// move labels the controlled objects, then the main object, with instance,
// removing any drain label.
func (r *ringAssigner) move(ctx context.Context, w *resourceCache, obj *metacache.Object, children []child, instance string) error {
	if err := r.labelChildren(ctx, children, instance); err != nil {
		return err
	}
	return r.patchMain(ctx, w, obj, map[string]*string{r.shardLabel: &instance, r.drainLabel: nil}, r.noDrainStart())
}

// childWrites bounds the concurrent label writes to one main object's
// controlled objects.
const childWrites = 8

// labelChildren gives every controlled object the shard label instance and
// no drain label, writing up to childWrites of them at once, and returns
// once all are written (they are relabelled before their main object).
// Each patch is locked on the controlled object's cached resourceVersion,
// as the main object's are: a decision taken on a stale cache, or by a
// sharder that stopped leading while the write waited (a frozen process),
// fails with a conflict on an object someone changed meanwhile instead of
// pulling it away from its owner's instance. A conflict fails the whole
// move before its main object is written; the object is decided again.
func (r *ringAssigner) labelChildren(ctx context.Context, children []child, instance string) error {
	labels := map[string]*string{r.shardLabel: &instance, r.drainLabel: nil}
	var g errgroup.Group
	g.SetLimit(childWrites)
	for _, c := range children {
		if c.obj.Labels[r.shardLabel] == instance && !drain.Requested(c.obj, r.name) {
			continue
		}
		g.Go(func() error {
			_, err := r.patchBytes(ctx, c.w, c.obj, drain.LabelPatch(c.obj.ResourceVersion, labels))
			if err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("labelling controlled %s %s/%s: %w", c.w.res.gk.Kind, c.obj.Namespace, c.obj.Name, err)
			}
			return nil
		})
	}
	return g.Wait()
}

// patchMain writes labels, and annotations where not nil, on a main object,
// locked on the cached resourceVersion: a decision taken on a stale cache
// fails with a conflict.
func (r *ringAssigner) patchMain(ctx context.Context, w *resourceCache, obj *metacache.Object, labels, annotations map[string]*string) error {
	out, err := r.patchBytes(ctx, w, obj, drain.MetadataPatch(obj.ResourceVersion, labels, annotations))
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("labelling %s %s/%s: %w", w.res.gk.Kind, obj.Namespace, obj.Name, err)
	}
	r.noteWrite(obj.UID, out.ResourceVersion)
	return nil
}

// drainStarted returns when the drain of obj started: as this sharder
// recorded it, else as the sharder that requested it wrote it on the object
// (a drain in flight when this one was elected), else now (a drain with no
// record gets a full timeout). A written start is read by this sharder's
// wall clock, so it is kept within the last timeout: a start in the future
// (a clock behind the writer's) counts as now, and one further back than
// timeout as timeout ago.
func (r *ringAssigner) drainStarted(obj *metacache.Object, now time.Time, timeout time.Duration) time.Time {
	if started, ok := r.drains.Started(obj.UID); ok {
		return started
	}
	written, ok := drain.Started(obj, r.name)
	if !ok {
		return time.Time{}
	}
	elapsed := min(max(now.Round(0).Sub(written), 0), timeout)
	return now.Add(-elapsed) // keeps now's monotonic reading
}

// noDrainStart is the annotations of a write that ends a drain: its start
// annotation goes with the drain label.
func (r *ringAssigner) noDrainStart() map[string]*string {
	return map[string]*string{v1alpha1.DrainStartedAnnotation(r.name): nil}
}

// errNotMovable is returned by act when a gone instance's objects stopped
// being movable (membership.Member.Movable) after the view the decision was
// taken on: the sharder's hold of its Lease ended.
var errNotMovable = errors.New("the instance's objects are no longer movable")

// notMovableRetry is when an object refused by errNotMovable is decided
// again; the membership change that refused it rebuilds the view meanwhile.
const notMovableRetry = 100 * time.Millisecond

// errGone is returned by act when the object was deleted meanwhile, so that
// nothing is recorded for it.
var errGone = errors.New("object deleted")

// requestDrain sets the drain label to target (empty: no target) and its
// start annotation to started, locked on the cached resourceVersion. It
// returns errGone when the object is gone: no drain is then recorded.
func (r *ringAssigner) requestDrain(ctx context.Context, w *resourceCache, obj *metacache.Object, target string, started time.Time) error {
	out, err := r.patchBytes(ctx, w, obj, drain.RequestPatchStarted(r.name, obj.ResourceVersion, target, started))
	if apierrors.IsNotFound(err) {
		return errGone
	}
	if err != nil {
		return fmt.Errorf("requesting drain of %s %s/%s: %w", w.res.gk.Kind, obj.Namespace, obj.Name, err)
	}
	r.noteWrite(obj.UID, out.ResourceVersion)
	return nil
}

// patchBytes sends a JSON merge patch and records a Forbidden answer as a
// problem of the resource.
func (r *ringAssigner) patchBytes(ctx context.Context, w *resourceCache, obj *metacache.Object, data []byte) (*metav1.PartialObjectMetadata, error) {
	out, err := r.c.writer.Resource(w.res.gvr).Namespace(obj.Namespace).Patch(ctx, obj.Name, types.MergePatchType, data,
		metav1.PatchOptions{FieldManager: r.c.opts.FieldManager})
	if w.cache.NotePatch(err) {
		r.triggerStatus()
	}
	return out, err
}
