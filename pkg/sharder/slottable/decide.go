package slottable

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/sharder/metrics"
	"github.com/sharder-dev/sharder/pkg/slots"
)

// decide runs slots.Step on the ring's table and writes the result.
func (c *Controller) decide(ctx context.Context, ring *v1alpha1.ControllerRing, st *ringState) (reconcile.Result, error) {
	log := logf.FromContext(ctx)
	count := ring.Spec.EffectiveSlotCount()
	table, err := slots.FromStatus(count, ring.Status.Slots)
	if err != nil {
		// Reported once per version of the ring: a change of the ring
		// (or someone correcting the table) decides again.
		if st.invalid != ring.ResourceVersion {
			st.invalid = ring.ResourceVersion
			log.Error(err, "The ring's slot table is not one the sharder writes; leaving it alone", "ring", ring.Name)
			c.recorder.Eventf(ring, corev1.EventTypeWarning, ReasonInvalidSlotTable, "The slot table in the ring's status is invalid, the sharder leaves it alone: %v", err)
		}
		return reconcile.Result{}, nil
	}
	leases := c.leases(ctx, ring)
	if res, stop, err := c.guardRevision(ctx, ring, table, leases, st); stop {
		return res, err
	}
	now := c.opts.Clock.Now()
	in, fenceEnds := c.input(ring, table, leases, st, now)
	res := slots.Step(table, in)
	next := earliest(res.Next, fenceEnds)
	if !res.Changed {
		c.setAssigned(ring.Name, table)
		if len(res.Fence) > 0 {
			requeue, err := c.fence(ctx, ring, leases, st, res.Fence)
			if err != nil || requeue {
				return reconcile.Result{Requeue: requeue}, err //nolint:staticcheck // a rate-limited retry
			}
		}
		return requeueAt(now, next), nil
	}

	// A slot of a gone instance is granted away only under the sharder's
	// hold of its Lease, and the hold is released only once the write that
	// grants it away returned: a permit per gone holder, around the write.
	var permits []func()
	defer func() {
		for _, done := range permits {
			done()
		}
	}()
	for _, id := range goneHolders(table, res.Actions) {
		done, ok := c.opts.Registry.BeginMove(ring.Name, id)
		if !ok {
			// Its hold ended since the members were read: decide again.
			log.V(1).Info("A gone instance is no longer movable; deciding the slot table again", "ring", ring.Name, "instance", id)
			c.setAssigned(ring.Name, table)
			return reconcile.Result{Requeue: true}, nil //nolint:staticcheck // a rate-limited retry
		}
		permits = append(permits, done)
	}

	updated := ring.DeepCopy()
	updated.Status.Slots = res.Table.Status()
	var patchOpts []client.SubResourcePatchOption
	if c.opts.FieldManager != "" {
		patchOpts = append(patchOpts, client.FieldOwner(c.opts.FieldManager))
	}
	if err := c.writer.Status().Patch(ctx, updated, client.MergeFromWithOptions(ring, client.MergeFromWithOptimisticLock{}), patchOpts...); err != nil {
		c.setAssigned(ring.Name, table)
		switch {
		case apierrors.IsConflict(err):
			// Someone wrote the ring since it was read (or the cache is
			// behind): decide again on the ring as it is.
			log.V(1).Info("The ring changed since its slot table was read; deciding again", "ring", ring.Name)
			return reconcile.Result{Requeue: true}, nil //nolint:staticcheck // a rate-limited retry
		case apierrors.IsNotFound(err):
			return reconcile.Result{}, nil
		case apierrors.IsForbidden(err) && len(permits) > 0:
			// The webhook denies a grant away from an instance that holds
			// its Lease again (it came back since the decision): decide
			// again once the members show it.
			log.Info("The slot table write was denied; deciding again", "ring", ring.Name, "reason", err.Error())
			return reconcile.Result{Requeue: true}, nil //nolint:staticcheck // a rate-limited retry
		}
		// Whatever the error, the write has landed or never will (the
		// API server enforced its deadline): the permits may end.
		return reconcile.Result{}, fmt.Errorf("writing the slot table of ring %s: %w", ring.Name, err)
	}
	written := c.opts.Clock.Now()
	st.revs.saw(updated.Status.Slots)
	if slices.Contains(res.Actions, slots.Release) {
		st.releasesSeen[res.Table.Revision] = written
	}
	c.setAssigned(ring.Name, res.Table)
	observeMoves(ring.Name, table, res.Actions, in.ReleasesSeen, written)
	log.Info("Wrote the slot table", "ring", ring.Name, "revision", res.Table.Revision, "actions", summary(res.Actions))
	if len(res.Fence) > 0 {
		// The write changed no slot of the instances to fence (Step
		// fences on slots it keeps releasing).
		requeue, err := c.fence(ctx, ring, leases, st, res.Fence)
		if err != nil || requeue {
			return reconcile.Result{Requeue: requeue}, err //nolint:staticcheck // a rate-limited retry
		}
	}
	return requeueAt(now, next), nil
}

// input is what Step decides from besides the table: the ring's members as
// the lease controller published them, with their acknowledgements, and
// the holders of slots that are no member. A fenced instance is movable
// only once its fence's wait is over; input also returns the earliest end
// of a wait still running (zero when none).
func (c *Controller) input(ring *v1alpha1.ControllerRing, table slots.Table, leases map[string]*coordinationv1.Lease, st *ringState, now time.Time) (slots.Input, time.Time) {
	st.observeFences(leases, now)
	weight := ring.Spec.EffectiveVirtualNodes()
	in := slots.Input{
		Instances:    map[string]slots.Instance{},
		ReleasesSeen: st.seen(table, now),
		DrainTimeout: ring.Spec.EffectiveDrainTimeout(),
		Now:          now,
	}
	var fenceEnds time.Time
	for _, m := range c.opts.Registry.Members(ring.Name) {
		inst := slots.Instance{State: m.State, Weight: m.Weight(weight), Movable: m.Movable}
		if lease := leases[m.ID]; lease != nil {
			inst.Acknowledged = slots.ParseAcknowledgement(lease.Annotations[v1alpha1.AnnotationSlotsAcknowledged], ring.UID)
		}
		if f, ok := st.fenced[m.ID]; ok && m.State.Gone() {
			if end := f.at.Add(f.wait); now.Before(end) {
				inst.Movable = false
				fenceEnds = earliest(fenceEnds, end)
			}
		}
		in.Instances[m.ID] = inst
	}
	for _, s := range table.Slots {
		if _, known := in.Instances[s.Holder]; known || s.Holder == "" {
			continue
		}
		// A holder that is no member (its Lease was deleted before this
		// sharder led, or the table names it by hand) may still be running:
		// held as vanished until the lease controller, which learns of it
		// from the slot counts (setAssigned), publishes it and holds it by
		// creating its Lease. An ID no Lease can have is gone.
		if membership.InvalidID(s.Holder) != nil {
			in.Instances[s.Holder] = slots.Instance{State: membership.StateDead, Movable: true}
		} else {
			in.Instances[s.Holder] = slots.Instance{State: membership.StateVanished}
		}
	}
	return in, fenceEnds
}

// leases returns the ring's instance Leases by name as the cache holds
// them: shared with the cache, never to be changed. An acknowledgement is a
// fact that stays true: a cache behind only delays a grant.
func (c *Controller) leases(ctx context.Context, ring *v1alpha1.ControllerRing) map[string]*coordinationv1.Lease {
	list := &coordinationv1.LeaseList{}
	if err := c.client.List(ctx, list, client.InNamespace(ring.Spec.LeaseNamespace),
		client.MatchingLabels{v1alpha1.LabelRing: ring.Name}, client.UnsafeDisableDeepCopy); err != nil {
		logf.FromContext(ctx).Error(err, "Listing the Leases of a ring; no acknowledgement counts", "ring", ring.Name)
		return nil
	}
	out := make(map[string]*coordinationv1.Lease, len(list.Items))
	for i := range list.Items {
		out[list.Items[i].Name] = &list.Items[i]
	}
	return out
}

// seen returns the times the releases of table were first seen, recording
// now for those seen for the first time and forgetting revisions no slot
// is releasing for any more.
func (st *ringState) seen(table slots.Table, now time.Time) map[int64]time.Time {
	live := map[int64]bool{}
	for _, s := range table.Slots {
		if s.Releasing {
			live[s.Since] = true
			if _, ok := st.releasesSeen[s.Since]; !ok {
				st.releasesSeen[s.Since] = now
			}
		}
	}
	maps.DeleteFunc(st.releasesSeen, func(rev int64, _ time.Time) bool { return !live[rev] })
	return maps.Clone(st.releasesSeen)
}

// goneHolders returns the holders whose slots Step grants away as gone,
// sorted.
func goneHolders(table slots.Table, actions []slots.Action) []string {
	var ids []string
	for i, a := range actions {
		if a == slots.GrantGone && !slices.Contains(ids, table.Slots[i].Holder) {
			ids = append(ids, table.Slots[i].Holder)
		}
	}
	slices.Sort(ids)
	return ids
}

// setAssigned tells the lease controller how many slots each instance holds
// in table (it holds a dead instance's Lease while it holds any) and
// publishes the counts as sharder_ring_slots.
func (c *Controller) setAssigned(ring string, table slots.Table) {
	held := counts(table)
	c.opts.Registry.SetAssigned(ring, held)
	metrics.Slots.DeletePartialMatch(map[string]string{metrics.LabelRing: ring})
	for id, n := range held {
		metrics.Slots.WithLabelValues(ring, id).Set(float64(n))
	}
}

// observeMoves counts the slots a table write granted to another instance,
// by reason, and the time from each acknowledged release's write to the
// grant: table is the table decided on, releasesSeen when each of its
// releases was seen written, written when the grant's write returned.
func observeMoves(ring string, table slots.Table, actions []slots.Action, releasesSeen map[int64]time.Time, written time.Time) {
	for i, a := range actions {
		switch a {
		case slots.GrantAcknowledged:
			metrics.SlotMovesTotal.WithLabelValues(ring, metrics.SlotMoveRelease).Inc()
			if seen, ok := releasesSeen[table.Slots[i].Since]; ok {
				metrics.SlotReleaseDuration.WithLabelValues(ring).Observe(written.Sub(seen).Seconds())
			}
		case slots.GrantGone:
			metrics.SlotMovesTotal.WithLabelValues(ring, metrics.SlotMoveGone).Inc()
		}
	}
}

// counts returns how many slots each instance holds in table, granted and
// releasing: the lease controller holds a dead instance's Lease while it
// holds any.
func counts(table slots.Table) map[string]int32 {
	out := map[string]int32{}
	for _, s := range table.Slots {
		if s.Holder != "" {
			out[s.Holder]++
		}
	}
	return out
}

// summary counts actions other than keep and hold, for the log.
func summary(actions []slots.Action) map[string]int {
	out := map[string]int{}
	for _, a := range actions {
		if a != slots.Keep && a != slots.Hold {
			out[a.String()]++
		}
	}
	return out
}

// earliest returns the earlier of two times, zero meaning none.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

// requeueAt returns the result that requeues at next, if any.
func requeueAt(now, next time.Time) reconcile.Result {
	if next.IsZero() {
		return reconcile.Result{}
	}
	return reconcile.Result{RequeueAfter: max(next.Sub(now), time.Millisecond)}
}
