package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sharder-dev/sharder/internal/localrun"
	"github.com/sharder-dev/sharder/pkg/ring"
)

// The objects mode's starts of the sharder and its scale-out.

// startFigures are the times of one start of the sharder, from the
// process's start, and its CPU until every object was assigned.
type startFigures struct {
	synced, first, assigned, cpu time.Duration
}

// startSharderOn starts a sharder process on every object and measures
// the time to its caches' sync and to its first decision (the first of
// o.unassigned labelled), waits until every object is assigned, and
// reads its memory.
func (o *objectsRun) startSharderOn(ctx context.Context, name, what string) error {
	var f startFigures
	t0 := time.Now()
	if err := o.startSharder(ctx, name); err != nil {
		return err
	}
	err := localrun.Poll(ctx, 10*time.Minute, 20*time.Millisecond, func() error {
		if err := o.failure(); err != nil {
			return errors.Join(err, errStop)
		}
		if !strings.Contains(o.sharder.CurrentLogs(), syncedMessage) {
			return errors.New("the ring's caches have not synced")
		}
		f.synced = time.Since(t0)
		return nil
	})
	if err != nil {
		return err
	}
	if err := o.waitAssigned(ctx, 30*time.Minute); err != nil {
		return err
	}
	events := o.acks.labelEvents(t0)
	first, ok := firstArrivalOf(events, o.unassigned)
	if !ok {
		return errors.New("no object without a label was assigned")
	}
	f.first, f.assigned = first.Sub(t0), lastEvent(events).Sub(t0)
	if f.cpu, err = cpuTime(o.sharder.Pid()); err != nil {
		return err
	}
	okStart := f.first <= targetStartUp
	o.add(fmt.Sprintf("%s on %d objects: from the sharder's start to its caches synced, and to its first decision (the first of the %d objects without a label labelled)", what, o.total, len(o.unassigned)),
		fmt.Sprintf("**%s**, **%s**", seconds(f.synced), seconds(f.first)), "", "≤ "+seconds(targetStartUp), okStart)
	// Go returns the memory of the start-up's garbage to the system
	// gradually: steady is what is left a while later.
	if err := sleep(ctx, steadyAfter); err != nil {
		return err
	}
	o.add(fmt.Sprintf("  the %d objects without a label assigned (from the sharder's start to the last label; one write each)", len(o.unassigned)),
		fmt.Sprintf("%s (%.0f/s), sharder CPU %s", seconds(f.assigned), float64(len(o.unassigned))/f.assigned.Seconds(), seconds(f.cpu)), "", "", true)
	m, err := o.sharder.Memory()
	if err != nil {
		return err
	}
	o.steadyRSS, o.peakRSS = m.RSS, m.Peak
	ratio := float64(m.Peak) / float64(m.RSS)
	o.add(fmt.Sprintf("  sharder peak RSS from its start (VmHWM) / RSS %s after every object was assigned", steadyAfter),
		fmt.Sprintf("**%.2f** (%s / %s)", ratio, mib(m.Peak), mib(m.RSS)), "", fmt.Sprintf("≤ %.1f", targetPeakToSteady), ratio <= targetPeakToSteady)
	if o.heap, err = o.liveHeap(ctx); err != nil {
		return err
	}
	perObject := o.heap / float64(o.total)
	o.add("  sharder live heap (after GC) per cached object, everything else included",
		fmt.Sprintf("**%.0f B** (%s)", perObject, mib(uint64(o.heap))), "", fmt.Sprintf("≤ %d B", targetHeapPerObject), perObject <= targetHeapPerObject)
	o.heapTop, err = o.heapProfile(ctx)
	return err
}

// firstArrivalOf returns the time of the first event that labelled one of
// the objects keys holds.
func firstArrivalOf(events []labelEvent, keys map[string]bool) (time.Time, bool) {
	for _, e := range events {
		if keys[e.key] && e.from.instance == "" && e.to.instance != "" {
			return e.at, true
		}
	}
	return time.Time{}, false
}

// scaleOut adds one instance: the sharder's CPU for the decisions (the
// pass over its caches that finds the objects to move) and for the whole
// move, and the API server's LIST requests meanwhile.
func (o *objectsRun) scaleOut(ctx context.Context) error {
	id := instanceID(o.p.instances)
	lists0, err := o.apiServerLists(ctx)
	if err != nil {
		return err
	}
	if err := o.fleet.start(ctx, id); err != nil {
		return err
	}
	// The holder creates its Lease a lease duration after finding it
	// missing: the window starts a second before.
	if err := sleep(ctx, o.p.leaseDuration-time.Second); err != nil {
		return err
	}
	prof := o.startCPUProfile(ctx, "scale-out", o.p.profileDuration)
	t0 := time.Now()
	cpu0, err := cpuTime(o.sharder.Pid())
	if err != nil {
		return err
	}
	err = localrun.Poll(ctx, 2*time.Minute, 500*time.Millisecond, func() error {
		if err := o.failure(); err != nil {
			return errors.Join(err, errStop)
		}
		if _, ok := firstMove(o.acks.labelEvents(t0), t0, nil); !ok {
			return errors.New("no object moved yet")
		}
		return nil
	})
	if err != nil {
		return err
	}
	// The whole move takes as long as the control plane needs for two
	// writes per moved object: a run on a slow machine reports how far it
	// got instead.
	settled := o.waitAssigned(ctx, moveLimit) == nil
	if err := o.failure(); err != nil {
		return err
	}
	took := time.Since(t0)
	cpu1, err := cpuTime(o.sharder.Pid())
	if err != nil {
		return err
	}
	lists1, err := o.apiServerLists(ctx)
	if err != nil {
		return err
	}
	top, err := prof.wait()
	if err != nil {
		return err
	}
	decisions, err := o.focusedCPU(ctx, "scale-out", decisionFocus)
	if err != nil {
		return err
	}
	events := o.acks.labelEvents(t0)
	moved, ok := firstMove(events, t0, nil)
	if !ok {
		return errors.New("no object moved")
	}
	lease, err := (&scale{bench: o.bench}).lease(ctx, id)
	if err != nil {
		return err
	}
	t := o.tally()
	okCPU := decisions <= targetScaleOutCPU
	o.add(fmt.Sprintf("scale-out %d → %d instances: sharder CPU of the decisions (its pass over the caches, from its CPU profile)", o.p.instances, o.p.instances+1),
		fmt.Sprintf("**%s**", seconds(decisions)), "", "≤ "+seconds(targetScaleOutCPU), okCPU)
	o.add("  LIST requests the API server served meanwhile (all clients)", fmt.Sprintf("%.0f", lists1-lists0), "", "0", lists1 == lists0)
	if lease.Spec.AcquireTime != nil {
		o.add("  from the new instance's Lease acquired to the first drain requested", seconds(moved.at.Sub(lease.Spec.AcquireTime.Time)), "", "", true)
	}
	if !settled {
		o.add(fmt.Sprintf("  the move, stopped waiting after %s: %d objects on %s, %d draining", moveLimit, t.perInstance[id], id, t.draining),
			fmt.Sprintf("sharder CPU %s", seconds(cpu1-cpu0)), "", "", true)
	} else {
		if err := o.checkPlacement(); err != nil {
			return err
		}
		o.add(fmt.Sprintf("  the whole move: %d objects drained to %s and handed over (2 writes each), every object then where the ring puts it", t.perInstance[id], id),
			fmt.Sprintf("%s, sharder CPU %s", seconds(took), seconds(cpu1-cpu0)), "", "", true)
	}
	o.profiles = append(o.profiles, profile{step: "scale-out", top: top})
	return nil
}

// checkPlacement checks that every object is on the instance the ring of
// the fleet's live instances assigns it to.
func (o *objectsRun) checkPlacement() error {
	r, err := o.ring()
	if err != nil {
		return err
	}
	o.acks.mu.Lock()
	defer o.acks.mu.Unlock()
	wrong := 0
	for key, s := range o.acks.last {
		ns, name, _ := strings.Cut(key, "/")
		want, err := r.Lookup(ring.ObjectKey(configMapKind.Group, configMapKind.Kind, ns, name))
		if err != nil {
			return err
		}
		if s.instance != want {
			wrong++
		}
	}
	if wrong > 0 {
		return fmt.Errorf("%d objects are not on the instance the ring assigns them to", wrong)
	}
	return nil
}

func bigObjectName(i int) string { return fmt.Sprintf("%s-%07d", objectsPrefix, i) }

func lastEvent(events []labelEvent) time.Time {
	var last time.Time
	for _, e := range events {
		if e.at.After(last) {
			last = e.at
		}
	}
	return last
}
