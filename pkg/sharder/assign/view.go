package assign

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/ring"
	"github.com/sharder-dev/sharder/pkg/sharder/ringbuilds"
)

// ringView is a ring's membership and the ring built from its ready
// instances. It is immutable once built.
type ringView struct {
	ring ring.Ring
	// empty reports whether ring has no instance: no object has a target.
	empty   bool
	members []membership.Member // all instances, sorted by ID
	states  map[string]membership.Member
	// maxPromise is the largest sum of the watch lag and the bound on
	// stopping a member promises (promiseOf).
	maxPromise time.Duration
}

// promiseOf is how long after the sharder saw it release an object by a
// forced move instance m may still be working on it, besides ForceGrace: it
// sees the object leave within its watch lag (or stops reconciling because
// its watch is behind) and cancels its reconciles, which return within its
// bound on stopping or its process exits.
func promiseOf(m membership.Member) time.Duration {
	return m.MaxWatchLag + m.MaxStop
}

// stateOf returns the state of instance id, whether its objects may move
// now if it is gone (membership.Member.Movable) and, for an instance that
// is not a member, until when it is held (zero: until the membership
// changes). An instance that is no member (its Lease was deleted before this
// sharder led, or its objects were labelled by hand) may still be running:
// it is held as vanished until the lease controller, which learns of it
// from the objects' counts, publishes it as a member and holds it (it
// creates its Lease) before anything of it moves. An ID that no Lease can
// have (membership.InvalidID) is gone, with no Lease anybody could hold.
//
//nolint:unparam // the time and the hold's end belong to the decision's inputs; no state ends at a time yet
func (v *ringView) stateOf(id string, _ time.Time) (membership.State, bool, time.Time) {
	if m, ok := v.states[id]; ok {
		return m.State, m.Movable, time.Time{}
	}
	if membership.InvalidID(id) != nil {
		return membership.StateDead, true, time.Time{}
	}
	return membership.StateVanished, false, time.Time{}
}

// buildView builds the view of members under cfg. rings keeps the rings
// built last, so the ring is rebuilt only when its ready instances or their
// weights changed; rebuilt reports whether this call built it.
func buildView(rings *ringbuilds.Builds, cfg *ringConfig, members []membership.Member) (*ringView, bool, error) {
	v := &ringView{members: members, states: make(map[string]membership.Member, len(members))}
	for _, m := range members {
		v.states[m.ID] = m
		v.maxPromise = max(v.maxPromise, promiseOf(m))
	}
	rg, rebuilt, err := rings.Build(cfg.name, cfg.algorithm, cfg.virtualNodes, members)
	if err != nil {
		return nil, false, err
	}
	v.ring = rg
	// A ring with no instance has no target for any key.
	_, err = rg.Lookup("")
	v.empty = errors.Is(err, ring.ErrNoInstance)
	return v, rebuilt, nil
}

// rebuild takes the ring's current membership and configuration, reports
// what changed and queues the objects that must move. all also queues the
// objects that stay but need work (start and configuration changes: see
// needsWork).
func (r *ringAssigner) rebuild(ctx context.Context, all bool) {
	cfg := r.cfg.Load()
	prev := r.view.Load()
	members := r.c.opts.Registry.Members(r.name)
	v, _, err := buildView(r.c.opts.Rings, cfg, members)
	if err != nil {
		r.logger.Error(err, "Cannot build ring", "algorithm", cfg.algorithm)
		r.event(corev1.EventTypeWarning, "RingBuildFailed", "Cannot build the %s ring: %v", cfg.algorithm, err)
		return
	}
	r.view.Store(v)
	if prev != nil {
		if change := describeMembershipChange(prev.members, members); change != "" {
			r.logger.Info("Membership changed", "change", change)
			r.event(corev1.EventTypeNormal, "MembershipChanged", "%s", change)
		}
	}
	r.triggerStatus()

	var drains, dead, held, total int
	selected := map[string]bool{} // per namespace: one selector match each, not one per object
	for _, w := range r.mains {
		for obj := range w.cache.List() {
			sel, ok := selected[obj.Namespace]
			if !ok {
				sel = r.selected(obj.Namespace)
				selected[obj.Namespace] = sel
			}
			if !sel {
				continue
			}
			total++
			s, err := r.situation(v, cfg, w.res.gk, obj)
			if err != nil {
				r.enqueue(w, obj)
				continue
			}
			d := decide(s)
			switch d.action {
			case actionRelabelGone:
				dead++
			case actionRequestDrain, actionWait, actionRetarget, actionForce, actionAssignForced:
				drains++
			case actionHold:
				if s.current != "" && s.target != "" {
					held++
				}
			}
			if d.action != actionKeep || all && r.needsWork(obj, s, d) {
				r.enqueue(w, obj)
			}
		}
	}
	if moves := drains + dead; moves > 0 && ctx.Err() == nil {
		r.logger.Info("Rebalancing", "objects", total, "drains", drains, "dead", dead, "held", held)
		r.event(corev1.EventTypeNormal, "Rebalancing",
			"Moving %d of %d objects: %d drained from ready instances, %d relabelled from instances that are gone, %d held on instances that may still be working",
			moves, total, drains, dead, held)
	}
}

// describeMembershipChange lists joined, left and changed instances; empty
// when nothing a person cares about changed.
func describeMembershipChange(prev, cur []membership.Member) string {
	before := map[string]membership.Member{}
	for _, m := range prev {
		before[m.ID] = m
	}
	var parts []string
	for _, m := range cur {
		old, ok := before[m.ID]
		delete(before, m.ID)
		switch {
		case !ok:
			parts = append(parts, fmt.Sprintf("%s joined (%s)", m.ID, m.State))
		case old.State != m.State:
			parts = append(parts, fmt.Sprintf("%s %s -> %s", m.ID, old.State, m.State))
		case old.VirtualNodes != m.VirtualNodes:
			parts = append(parts, fmt.Sprintf("%s virtual nodes %d -> %d", m.ID, old.VirtualNodes, m.VirtualNodes))
		}
	}
	left := make([]string, 0, len(before))
	for id := range before {
		left = append(left, id)
	}
	slices.Sort(left)
	for _, id := range left {
		parts = append(parts, id+" left")
	}
	ready := 0
	for _, m := range cur {
		if m.State == membership.StateReady {
			ready++
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return fmt.Sprintf("%s; %d of %d instances ready", strings.Join(parts, ", "), ready, len(cur))
}
