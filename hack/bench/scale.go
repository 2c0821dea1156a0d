package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/internal/localrun"
	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// The scale mode (--scale) measures one ring of many instances: their Leases
// are held by this process (fleet), which also acknowledges their drains
// (acknowledger). It measures the sharder's CPU while only the renewals go
// on, then, for one instance added, one stopped gracefully and one killed,
// the time from the membership change to the first object moved and the
// sharder's CPU for the change.

// Targets of the scale mode.
const (
	targetSteadyCPU   = 0.10 // cores
	targetChangeCPU   = 100 * time.Millisecond
	targetFirstMove   = time.Second
	changeTail        = 2 * time.Second // after the objects settle: the ring's status write and the Lease hold's end
	scaleProfileCount = 30 * time.Second
)

// scale is one run of the scale mode.
type scale struct {
	*bench
	fleet    *fleet
	fleetLog *fleetLog
	acks     *acknowledger
	// steady is the sharder's CPU (cores) while only the renewals go on.
	steady float64
	// next is the index of the next instance to add.
	next int
}

// setUp creates the ring and the objects, then starts the fleet's holders,
// spread over one renew period as instances started at different times
// renew; it returns once every instance holds its Lease.
func (s *scale) setUp(ctx context.Context) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: objectNamespace, Labels: map[string]string{benchLabel: "true"}}}
	if err := s.c.Create(ctx, ns); err != nil {
		return err
	}
	if err := localrun.EnsureNamespace(ctx, s.c, leaseNamespace); err != nil {
		return err
	}
	if err := s.createRing(ctx); err != nil {
		return err
	}
	var err error
	if s.instUser, err = s.cl.ControlPlane.AddServiceAccountUser("instance", leaseNamespace, instanceAccount); err != nil {
		return err
	}
	if s.fleetLog, err = newFleetLog(filepath.Join(s.cl.LogDir, "fleet.log")); err != nil {
		return err
	}
	go s.fleetLog.summarize(ctx, time.Second)
	if s.fleet, err = newFleet(s.instUser.Config, ringName, leaseNamespace, s.p.leaseDuration, s.fleetLog); err != nil {
		return err
	}
	if s.acks, err = newAcknowledger(s.cl.ControlPlane.Config, s.fleet, objectNamespace, ringName); err != nil {
		return err
	}
	if err := s.acks.start(ctx); err != nil {
		return err
	}
	if s.tracker, err = localrun.NewLabelWatch(s.cl.ControlPlane.Config, configMaps, objectNamespace, ringName); err != nil {
		return err
	}
	if err := s.tracker.Start(ctx); err != nil {
		return err
	}

	// The objects first, the instances once they exist: 10,000 creations
	// from 32 parallel writers take the API server's every spare cycle on
	// a small machine, and the holders creating and first renewing their
	// Leases meanwhile waited past their renew deadline for it (a run lost
	// 799 of 1,000 Leases while the creations took 52 s). A real ring's
	// instances do not all start during a bulk load of its objects, and
	// the sharder, which is what is measured, starts only after both.
	t0 := time.Now()
	if err := createObjects(ctx, s.c, objectNamespace, ringObjectPrefix, s.p.objects, s.p.workers); err != nil {
		return err
	}
	fmt.Printf("  created %d ConfigMaps in %s\n", s.p.objects, time.Since(t0).Round(time.Millisecond))
	t0 = time.Now()
	spread := s.p.leaseDuration / 3 / time.Duration(s.p.instances)
	for i := range s.p.instances {
		if err := s.fleet.start(ctx, instanceID(i)); err != nil {
			return err
		}
		time.Sleep(spread)
	}
	s.next = s.p.instances
	// A holder creates a Lease it has not held a lease duration after
	// finding it missing.
	err = localrun.Poll(ctx, 2*time.Minute+s.p.leaseDuration, 100*time.Millisecond, func() error {
		if err := s.fleet.failure(); err != nil {
			return err
		}
		if n := s.fleet.heldCount(); n < s.p.instances {
			return fmt.Errorf("%d of %d instances hold their Lease", n, s.p.instances)
		}
		return nil
	})
	if err != nil {
		return err
	}
	fmt.Printf("  %d instances hold their Leases, %s after the first started\n", s.p.instances, time.Since(t0).Round(time.Millisecond))
	return nil
}

// initialAssignment starts the sharder on the existing objects and Leases
// and waits until every object is on its instance.
func (s *scale) initialAssignment(ctx context.Context) error {
	t0 := time.Now()
	if err := s.startSharder(ctx, "sharder"); err != nil {
		return err
	}
	if err := s.waitSettled(ctx, 10*time.Minute); err != nil {
		return err
	}
	took := lastChange(s.tracker.Snapshot()).Sub(t0)
	cpu, err := cpuTime(s.sharder.Pid())
	if err != nil {
		return err
	}
	counts := s.tracker.Assignment().Counts()
	least, most := s.p.objects, 0
	for _, id := range s.fleet.live() {
		least, most = min(least, counts[id]), max(most, counts[id])
	}
	s.add(fmt.Sprintf("initial assignment of %d objects to %d instances (from the sharder's start)", s.p.objects, s.p.instances),
		fmt.Sprintf("%s, sharder CPU %s; objects per instance %d to %d", seconds(took), seconds(cpu), least, most), "", "", true)
	return nil
}

// steadyRenewals measures the sharder's CPU over p.steady while every
// Lease renews and nothing else changes.
func (s *scale) steadyRenewals(ctx context.Context) error {
	if err := s.settle(ctx); err != nil {
		return err
	}
	prof := s.startCPUProfile(ctx, "steady renewals", min(scaleProfileCount, s.p.steady))
	w, err := s.startWindow(ctx)
	if err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(s.p.steady):
	}
	d, err := w.end(ctx)
	if err != nil {
		return err
	}
	if err := s.fleet.failure(); err != nil {
		return err
	}
	renewed, err := s.renewedLeases(ctx)
	if err != nil {
		return err
	}
	s.steady = d.cores()
	renewPeriod := s.p.leaseDuration / 3
	ok := s.steady <= targetSteadyCPU
	s.add(fmt.Sprintf("sharder CPU, steady: %d Leases renewing every %s, nothing else changing (%s)", s.p.instances, renewPeriod, s.p.steady),
		fmt.Sprintf("**%.1f %% of a core** (%s)", s.steady*100, seconds(d.sharder)), "", fmt.Sprintf("≤ %.0f %% of a core", targetSteadyCPU*100), ok)
	s.add("  its API requests meanwhile (all verbs)", fmt.Sprintf("%.0f (%.1f/s)", d.requests, d.requests/d.length.Seconds()), "", "", true)
	s.add("  Leases renewed within the last renew period + 1 s at its end", fmt.Sprintf("%d of %d", renewed, s.p.instances), "", "all", renewed == s.p.instances)
	s.add("  this benchmark process meanwhile (the holders, the acknowledger, two watches)", fmt.Sprintf("%.1f %% of a core", d.selfCores()*100), "", "", true)
	s.add("  the whole machine meanwhile (every process)", fmt.Sprintf("%.2f cores busy", d.machineCores()), "", "", true)
	return s.keepProfile("steady renewals", prof, ok)
}

// renewedLeases counts the ring's Leases held by their instance and renewed
// within the last renew period (plus a second of slack).
func (s *scale) renewedLeases(ctx context.Context) (int, error) {
	list := &coordinationv1.LeaseList{}
	if err := s.c.List(ctx, list, client.InNamespace(leaseNamespace), client.MatchingLabels{sharderv1alpha1.LabelRing: ringName}); err != nil {
		return 0, err
	}
	var renewals []time.Time
	for _, l := range list.Items {
		if ptr.Deref(l.Spec.HolderIdentity, "") == l.Name && l.Spec.RenewTime != nil && s.fleet.acknowledges(l.Name) {
			renewals = append(renewals, l.Spec.RenewTime.Time)
		}
	}
	return renewedWithin(renewals, time.Now(), s.p.leaseDuration/3+time.Second), nil
}

// added starts one more instance and measures from its Lease's creation to
// the first drain request and to the first object arriving on it.
func (s *scale) added(ctx context.Context) error {
	if err := s.settle(ctx); err != nil {
		return err
	}
	id := instanceID(s.next)
	s.next++
	if err := s.fleet.start(ctx, id); err != nil {
		return err
	}
	// The holder creates its Lease a lease duration after finding it
	// missing: the window starts a second before.
	if err := sleep(ctx, s.p.leaseDuration-time.Second); err != nil {
		return err
	}
	prof := s.startCPUProfile(ctx, "instance added", s.p.profileDuration)
	w, err := s.startWindow(ctx)
	if err != nil {
		return err
	}
	if err := localrun.Poll(ctx, time.Minute, 10*time.Millisecond, func() error {
		if !s.fleet.held(id) {
			return errors.New("the new instance does not hold its Lease yet")
		}
		return nil
	}); err != nil {
		return err
	}
	lease, err := s.lease(ctx, id)
	if err != nil {
		return err
	}
	changed := lease.Spec.AcquireTime.Time
	if err := s.waitSettled(ctx, 5*time.Minute); err != nil {
		return err
	}
	if err := sleep(ctx, changeTail); err != nil {
		return err
	}
	d, err := w.end(ctx)
	if err != nil {
		return err
	}
	events := s.acks.labelEvents(changed)
	drained, ok1 := firstMove(events, changed, nil)
	arrived, ok2 := firstArrival(events, changed, id)
	if !ok1 || !ok2 {
		return errors.New("no object moved to the new instance")
	}
	moved := 0
	for _, e := range events {
		if e.to.instance == id && e.from.instance != id {
			moved++
		}
	}
	first := arrived.at.Sub(changed)
	s.add(fmt.Sprintf("instance added (%d → %d): its Lease created → first drain request seen", s.p.instances, s.p.instances+1),
		seconds(drained.at.Sub(changed)), "", "", true)
	okMove := first <= targetFirstMove
	s.add(fmt.Sprintf("instance added: its Lease created → first object on it (%d moved to it)", moved),
		"**"+seconds(first)+"**", "", "≤ "+seconds(targetFirstMove), okMove)
	okCPU := s.addChangeCPU("instance added", d)
	return s.keepProfile("instance added", prof, okMove && okCPU)
}

// stopped stops an instance gracefully (its Lease released) and measures
// from the release to the first of its objects moved.
func (s *scale) stopped(ctx context.Context) error {
	if err := s.settle(ctx); err != nil {
		return err
	}
	victim := s.busiest()
	owned := s.acks.ownedBy(victim)
	prof := s.startCPUProfile(ctx, "instance stopped", s.p.profileDuration)
	w, err := s.startWindow(ctx)
	if err != nil {
		return err
	}
	stopping := time.Now()
	if err := s.fleet.stop(ctx, victim); err != nil {
		return fmt.Errorf("stopping %s: %w", victim, err)
	}
	lease, err := s.lease(ctx, victim)
	if err != nil {
		return err
	}
	// The release's renewTime is the change, unless the sharder's hold of
	// the released Lease has replaced it already: then the moment the stop
	// began (a few milliseconds earlier) stands for it.
	changed := stopping
	if ptr.Deref(lease.Spec.HolderIdentity, "") == "" && lease.Spec.RenewTime != nil {
		changed = lease.Spec.RenewTime.Time
	}
	if err := s.waitSettled(ctx, 5*time.Minute); err != nil {
		return err
	}
	if err := sleep(ctx, changeTail); err != nil {
		return err
	}
	d, err := w.end(ctx)
	if err != nil {
		return err
	}
	events := s.acks.labelEvents(w.start)
	moved, ok := firstMove(events, changed, map[string]bool{victim: true})
	if !ok {
		return fmt.Errorf("no object of %s moved", victim)
	}
	first := moved.at.Sub(changed)
	okMove := first <= targetFirstMove
	s.add(fmt.Sprintf("instance stopped gracefully: its Lease released → first of its %d objects moved", len(owned)),
		"**"+seconds(first)+"**", "", "≤ "+seconds(targetFirstMove), okMove)
	okCPU := s.addChangeCPU("instance stopped", d)
	return s.keepProfile("instance stopped", prof, okMove && okCPU)
}

// killedInstance stops an instance's renewals without a release, as a
// SIGKILL does, and measures from the moment the sharder may take its
// Lease (two lease durations after the last renewal, design §3) to the
// first of its objects moved, and the sharder's CPU from a second before
// the instance expires (one lease duration) until its objects settled.
func (s *scale) killedInstance(ctx context.Context) error {
	if err := s.settle(ctx); err != nil {
		return err
	}
	victim := s.busiest()
	owned := s.acks.ownedBy(victim)
	if err := s.fleet.kill(victim); err != nil {
		return err
	}
	// A renewal under way when the kill came may still land.
	if err := sleep(ctx, time.Second); err != nil {
		return err
	}
	lease, err := s.lease(ctx, victim)
	if err != nil {
		return err
	}
	if lease.Spec.RenewTime == nil {
		return fmt.Errorf("the Lease of %s has no renewTime", victim)
	}
	// The instance expires a lease duration after its last renewal (the
	// sharder stops giving it objects) and is taken over a lease duration
	// later (its objects move): the window covers both.
	lastRenewal := lease.Spec.RenewTime.Time
	due := lastRenewal.Add(2 * s.p.leaseDuration)
	if err := sleep(ctx, time.Until(lastRenewal.Add(s.p.leaseDuration-time.Second))); err != nil {
		return err
	}
	prof := s.startCPUProfile(ctx, "instance killed", s.p.leaseDuration+s.p.profileDuration)
	w, err := s.startWindow(ctx)
	if err != nil {
		return err
	}
	if err := s.waitSettled(ctx, 5*time.Minute); err != nil {
		return err
	}
	if err := sleep(ctx, changeTail); err != nil {
		return err
	}
	d, err := w.end(ctx)
	if err != nil {
		return err
	}
	moved, ok := firstMove(s.acks.labelEvents(w.start), w.start, map[string]bool{victim: true})
	if !ok {
		return fmt.Errorf("no object of %s moved", victim)
	}
	first := moved.at.Sub(due)
	okMove := first <= targetFirstMove
	s.add(fmt.Sprintf("instance killed (renewals stopped): 2 × lease (%s) after its last renewal → first of its %d objects moved", 2*s.p.leaseDuration, len(owned)),
		fmt.Sprintf("**%s** (%s after the last renewal)", seconds(first), seconds(moved.at.Sub(lastRenewal))), "", "≤ "+seconds(targetFirstMove), okMove)
	okCPU := s.addChangeCPU("instance killed", d)
	return s.keepProfile("instance killed", prof, okMove && okCPU)
}

// addChangeCPU adds the sharder's CPU for one membership change: its CPU
// over the change's window beyond what the steady renewals cost over the
// same time. It reports whether the target was met.
func (s *scale) addChangeCPU(change string, d windowCPU) bool {
	extra := cpuAbove(d.sharder, d.length, s.steady)
	ok := extra <= targetChangeCPU
	s.add(fmt.Sprintf("%s: sharder CPU for the change (its CPU over %s, to the objects settled + %s, less the steady rate's)", change, seconds(d.length), changeTail),
		fmt.Sprintf("**%s** (%s in all; %.0f API requests)", millis(extra), millis(d.sharder), d.requests), "", "≤ "+millis(targetChangeCPU), ok)
	return ok
}

// busiest returns the live instance with the most objects, so that a
// change that removes it moves some.
func (s *scale) busiest() string {
	counts := s.tracker.Assignment().Counts()
	best := ""
	for _, id := range s.fleet.live() {
		if best == "" || counts[id] > counts[best] {
			best = id
		}
	}
	return best
}

func (s *scale) lease(ctx context.Context, id string) (*coordinationv1.Lease, error) {
	lease := &coordinationv1.Lease{}
	return lease, s.c.Get(ctx, client.ObjectKey{Namespace: leaseNamespace, Name: id}, lease)
}

// waitSettled waits until every object is on the instance the ring of the
// live instances assigns it to, none draining. It fails at once when an
// instance lost its Lease without being killed.
func (s *scale) waitSettled(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if err := s.failure(); err != nil {
				cancel(err)
				return
			}
		}
	}()
	ctx, stop := context.WithTimeout(ctx, timeout)
	defer stop()
	err := s.tracker.Wait(ctx, settledOn(s.p.algorithm, s.p.objects, s.fleet.live()))
	if cause := context.Cause(ctx); err != nil && cause != nil && !errors.Is(cause, context.DeadlineExceeded) && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return err
}

// failure returns an error when the sharder exited or an instance lost its
// Lease without being killed: the figures would not be the ones meant.
func (s *scale) failure() error {
	if s.sharder != nil && s.sharder.Exited() {
		return fmt.Errorf("the sharder exited (%w); its log says why", s.sharder.ExitError())
	}
	return s.fleet.failure()
}
