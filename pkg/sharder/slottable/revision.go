package slottable

import (
	"context"
	"fmt"
	"slices"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/slots"
)

// A ring's table never goes back (docs/design.md §11). Instances ignore a
// table not newer than the last they acted on, but an instance started
// afresh has acted on none: were the sharder to decide on a table older than
// one the running instances acted on, its next revisions would be ignored by
// them and applied by new ones, and a slot could be granted to a new
// instance while a running one still holds it. So the controller remembers,
// per ring UID, the highest revision it has seen (written, shown by its
// cache, acknowledged on a Lease) and decides on no table below it, nor on
// a table of that revision with other content.

// revisions is what the controller has seen of one ring's table revisions.
type revisions struct {
	// newest is the newest table this process wrote or saw in its cache, in
	// the form of the ring's status; nil before the first.
	newest *v1alpha1.SlotTable
	// acknowledged is the highest revision an instance acknowledged on its
	// Lease, and ackedBy that instance.
	acknowledged int64
	ackedBy      string
}

// floor returns the highest revision seen.
func (r *revisions) floor() int64 {
	if r.newest != nil {
		return max(r.newest.Revision, r.acknowledged)
	}
	return r.acknowledged
}

// saw records status as seen (in the cache, or written) when it is newer
// than the newest seen. It keeps a copy: status may be the cache's.
func (r *revisions) saw(status *v1alpha1.SlotTable) {
	if status != nil && (r.newest == nil || status.Revision > r.newest.Revision) {
		r.newest = status.DeepCopy()
	}
}

// sawAcknowledgements records the highest revision acknowledged on the
// ring's Leases (those of a ring of another UID acknowledge nothing).
func (r *revisions) sawAcknowledgements(uid types.UID, leases map[string]*coordinationv1.Lease) {
	for id, lease := range leases {
		if rev := slots.ParseAcknowledgement(lease.Annotations[v1alpha1.AnnotationSlotsAcknowledged], uid); rev > r.acknowledged {
			r.acknowledged, r.ackedBy = rev, id
		}
	}
}

// wentBack reports whether table (status parsed, count slots) went back: a
// revision below the floor, or the newest revision seen with other content
// (a table edited in place).
func (r *revisions) wentBack(count int, status *v1alpha1.SlotTable, table slots.Table) bool {
	if table.Revision < r.floor() {
		return true
	}
	if r.newest == nil || table.Revision != r.newest.Revision || equality.Semantic.DeepEqual(status, r.newest) {
		return false
	}
	// The same slots may be written in other forms ("0,1" for "0-1").
	newest, err := slots.FromStatus(count, r.newest)
	return err != nil || !slices.Equal(newest.Slots, table.Slots)
}

// guardRevision checks the ring's table (parsed as table) against the
// revisions seen, and reports whether decide must stop there, with its
// result. A table that went back in the cache is read again from the API
// server (the cache may be behind this process's own write, or behind a
// Lease's acknowledgement); one that went back there too is restored or
// left alone (restore).
func (c *Controller) guardRevision(ctx context.Context, ring *v1alpha1.ControllerRing, table slots.Table, leases map[string]*coordinationv1.Lease, st *ringState) (reconcile.Result, bool, error) {
	count := ring.Spec.EffectiveSlotCount()
	st.revs.sawAcknowledgements(ring.UID, leases)
	if !st.revs.wentBack(count, ring.Status.Slots, table) {
		st.revs.saw(ring.Status.Slots)
		return reconcile.Result{}, false, nil
	}
	live := &v1alpha1.ControllerRing{}
	if err := c.reader.Get(ctx, client.ObjectKeyFromObject(ring), live); err != nil {
		if apierrors.IsNotFound(err) {
			return reconcile.Result{}, true, nil
		}
		return reconcile.Result{}, true, fmt.Errorf("reading ring %s, whose cached slot table went back: %w", ring.Name, err)
	}
	liveTable, err := slots.FromStatus(count, live.Status.Slots)
	if live.UID != ring.UID || err != nil || !st.revs.wentBack(count, live.Status.Slots, liveTable) {
		// The cache is behind (the ring changed, or it carries an invalid
		// table): its event comes; decide then.
		logf.FromContext(ctx).V(1).Info("The cached slot table is behind the ring's; waiting for the cache", "ring", ring.Name, "cached", table.Revision)
		return reconcile.Result{RequeueAfter: cacheBehindRetry}, true, nil //nolint:nilerr // an invalid live table is the cache's to deliver, not an error here
	}
	return c.restore(ctx, live, liveTable, st)
}

// cacheBehindRetry is how soon a ring whose cache is behind the API server
// is decided again, should the cache's event not come first.
const cacheBehindRetry = time.Second

// restore answers a ring whose table went back, read from the API server as
// live with table: when this process knows the newest table seen (no
// acknowledgement is above it), it writes that table back with the revision
// above every one seen, locked on live's resourceVersion; otherwise it
// writes nothing. Either way it reports the ring (a log line and a warning
// event, once per version of the ring). Deciding on the older table's
// content is no answer: the instances holding slots by the newer table
// would lose them with no release.
func (c *Controller) restore(ctx context.Context, live *v1alpha1.ControllerRing, table slots.Table, st *ringState) (reconcile.Result, bool, error) {
	log := logf.FromContext(ctx)
	floor := st.revs.floor()
	report := st.invalid != live.ResourceVersion
	st.invalid = live.ResourceVersion
	if st.revs.newest == nil || st.revs.newest.Revision < floor {
		if report {
			log.Error(nil, "The ring's slot table went back below a revision an instance acknowledged, whose table the sharder does not know; leaving it alone",
				"ring", live.Name, "revision", table.Revision, "acknowledged", floor, "instance", st.revs.ackedBy)
			c.recorder.Eventf(live, corev1.EventTypeWarning, ReasonInvalidSlotTable,
				"The slot table's revision %d is below revision %d, which instance %s acknowledged; the sharder does not know that table and leaves the ring alone until its status carries a table of a revision above %d",
				table.Revision, floor, st.revs.ackedBy, floor)
		}
		return reconcile.Result{}, true, nil
	}
	restored := st.revs.newest.DeepCopy()
	restored.Revision = floor + 1
	if report {
		log.Error(nil, "The ring's slot table went back; restoring the newest table the sharder saw", "ring", live.Name,
			"revision", table.Revision, "newest", st.revs.newest.Revision, "restoredAs", restored.Revision)
		c.recorder.Eventf(live, corev1.EventTypeWarning, ReasonInvalidSlotTable,
			"The slot table of revision %d went back from the table of revision %d the sharder saw; the sharder writes that table back as revision %d",
			table.Revision, st.revs.newest.Revision, restored.Revision)
	}
	updated := live.DeepCopy()
	updated.Status.Slots = restored
	var patchOpts []client.SubResourcePatchOption
	if c.opts.FieldManager != "" {
		patchOpts = append(patchOpts, client.FieldOwner(c.opts.FieldManager))
	}
	if err := c.writer.Status().Patch(ctx, updated, client.MergeFromWithOptions(live, client.MergeFromWithOptimisticLock{}), patchOpts...); err != nil {
		switch {
		case apierrors.IsConflict(err):
			return reconcile.Result{Requeue: true}, true, nil //nolint:staticcheck // a rate-limited retry
		case apierrors.IsNotFound(err):
			return reconcile.Result{}, true, nil
		}
		return reconcile.Result{}, true, fmt.Errorf("restoring the slot table of ring %s: %w", live.Name, err)
	}
	st.revs.saw(restored)
	log.Info("Restored the slot table", "ring", live.Name, "revision", restored.Revision)
	return reconcile.Result{}, true, nil
}
