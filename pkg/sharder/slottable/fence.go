package slottable

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/sharder/metrics"
)

// fence is the sharder's fence of an instance (docs/design.md §11): its
// slots are movable only from at + wait, one lease duration of the instance
// and the bound on stopping it promises (membership.FenceWait) after the
// sharder saw its takeover land (or first saw the fenced Lease, not knowing
// when it was taken).
type fence struct {
	at   time.Time
	wait time.Duration
}

// observeFences records the fences seen on the ring's Leases for the first
// time, at now, and forgets those whose wait is over and which the Lease no
// longer shows. A fence this process wrote is kept through its wait, however
// far behind the cache is.
func (st *ringState) observeFences(leases map[string]*coordinationv1.Lease, now time.Time) {
	for id, lease := range leases {
		if _, ok := st.fenced[id]; !ok && membership.Fenced(lease) {
			// The takeover doubled the instance's duration; its own bound on
			// stopping is on the Lease still.
			st.fenced[id] = fence{at: now, wait: membership.FenceWait(membership.DurationOf(lease)/membership.TakeoverFactor, stopOf(lease))}
		}
	}
	for id, f := range st.fenced {
		if lease := leases[id]; (lease == nil || !membership.Fenced(lease)) && !now.Before(f.at.Add(f.wait)) {
			delete(st.fenced, id)
		}
	}
}

// fence takes the Leases of the ready instances ids, which did not
// acknowledge a release within the ring's drainTimeout, as the lease
// controller takes an uncertain one (holder Identity, twice the Lease's
// duration), annotated sharder.dev/fenced (membership.Fence), locked on the
// resourceVersion read. The instance loses its Lease and stops; the lease controller sees it
// dead and holds its Lease while it holds slots; its slots are granted to
// others one lease duration d and the instance's bound on stopping S after
// the takeover returned (Input.Movable): it stops admitting reconciles at
// its renew deadline, shorter than d, after the start of its last
// successful renewal, and those it cancelled return within S or its process
// exits (membership.FenceWait). It reports whether to decide again
// (a Lease changed meanwhile: it may carry the acknowledgement).
func (c *Controller) fence(ctx context.Context, ring *v1alpha1.ControllerRing, leases map[string]*coordinationv1.Lease, st *ringState, ids []string) (bool, error) {
	log := logf.FromContext(ctx)
	requeue := false
	for _, id := range ids {
		lease := leases[id]
		if _, done := st.fenced[id]; done || lease == nil || ptr.Deref(lease.Spec.HolderIdentity, "") != id {
			// Fenced already, or its Lease as cached is not the ready
			// instance's: the registry and the cache differ; decide again
			// when they agree.
			continue
		}
		d := membership.DurationOf(lease)
		taken := membership.Fence(lease, c.opts.Identity, c.opts.Clock.Now())
		if err := c.client.Update(ctx, taken); err != nil {
			if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
				requeue = true
				continue
			}
			return false, fmt.Errorf("fencing instance %s: taking Lease %s: %w", id, klog.KObj(lease), err)
		}
		// The wait counts from after the write returned: the takeover
		// landed before.
		wait := membership.FenceWait(d, stopOf(lease))
		st.fenced[id] = fence{at: c.opts.Clock.Now(), wait: wait}
		metrics.SlotFencesTotal.WithLabelValues(ring.Name).Inc()
		log.Info("Fenced an instance that did not acknowledge a release within the drain timeout: took its Lease",
			"ring", ring.Name, "instance", id, "drainTimeout", ring.Spec.EffectiveDrainTimeout(), "wait", wait)
		c.recorder.Eventf(ring, corev1.EventTypeWarning, ReasonFenced,
			"Instance %s did not acknowledge the release of its slots within %s; the sharder took its Lease and grants its slots to others %s later",
			id, ring.Spec.EffectiveDrainTimeout(), wait)
	}
	return requeue, nil
}

// stopOf is the bound on stopping lease's instance promises, 0 for none or a
// malformed one (the lease controller reports it).
func stopOf(lease *coordinationv1.Lease) time.Duration {
	s, err := membership.MaxStopOf(lease)
	if err != nil {
		return 0
	}
	return s
}
