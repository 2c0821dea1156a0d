package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/internal/localrun"
	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// initialAssignment: objects exist and instances hold their Leases before
// the sharder starts; measured from the sharder's start to the last object
// labelled. The floor with no sharder running is measured just before.
func (b *bench) initialAssignment(ctx context.Context) error {
	start := time.Now()
	if err := createObjects(ctx, b.c, objectNamespace, ringObjectPrefix, b.p.objects, b.p.workers); err != nil {
		return err
	}
	if err := createObjects(ctx, b.c, unrelatedNamespace, "floor", b.p.objects, b.p.workers); err != nil {
		return err
	}
	fmt.Printf("  created 2 × %d ConfigMaps in %s\n", b.p.objects, time.Since(start).Round(time.Millisecond))
	for i := range 3 {
		if _, err := b.startInstance(ctx, instanceID(i)); err != nil {
			return err
		}
	}
	if err := b.wait(ctx, time.Minute, func(objs []localrun.Watched) error {
		if len(objs) != b.p.objects {
			return fmt.Errorf("%d objects tracked", len(objs))
		}
		return nil
	}); err != nil {
		return err
	}
	var err error
	if b.stopped, err = b.measureFloor(ctx, "no sharder running (3 instances)"); err != nil {
		return err
	}
	if err := b.measureRingFloor(ctx); err != nil {
		return err
	}

	t0, machine0 := time.Now(), machineCPU()
	if err := b.startSharder(ctx, "sharder"); err != nil {
		return err
	}
	prof := b.startCPUProfile(ctx, "initial assignment", b.p.profileDuration)
	if err := b.wait(ctx, 5*time.Minute, localrun.SettledOn(configMapKind, b.p.objects, b.liveInstances()...)); err != nil {
		return err
	}
	took := lastChange(b.tracker.Snapshot()).Sub(t0)
	machine := machineCPU() - machine0
	cpu, err := cpuTime(b.sharder.Pid())
	if err != nil {
		return err
	}
	writes, err := b.patchesSent(ctx)
	if err != nil {
		return err
	}
	ok := b.addRatio(fmt.Sprintf("assign %d pre-existing objects (from the sharder's start, 3 instances)", b.p.objects),
		took, b.p.objects, 1.15, "")
	b.addCPU("initial assignment", cpu, writes)
	b.addMachineCPU("initial assignment", machine, b.p.objects, cpu, b.ringFloor)
	return b.keepProfile("initial assignment", prof, ok)
}

// latency creates objects at a steady rate and measures, per object, the
// time from the create request to the shard label seen on a watch.
func (b *bench) latency(ctx context.Context) error {
	if err := b.settle(ctx); err != nil {
		return err
	}
	lat, _, err := b.createAtRate(ctx, "rate")
	if err != nil {
		return err
	}
	n := len(lat)
	p50, p99 := lat[n*50/100], lat[min(n*99/100, n-1)]
	b.add(fmt.Sprintf("watch mode: assignment latency p50 (%d objects created at %d/s)", n, b.p.rate), millis(p50), "", "", true)
	b.add(fmt.Sprintf("watch mode: assignment latency p99 (%d objects created at %d/s)", n, b.p.rate), millis(p99), "", "≤ 10 ms", p99 <= 10*time.Millisecond)
	b.add("watch mode: assignment latency max", millis(lat[n-1]), "", "", true)
	seen, err := b.watchDelay(ctx)
	if err != nil {
		return err
	}
	m := len(seen)
	b.add(fmt.Sprintf("floor of the latency: create to the object seen on a watch, outside the ring, p50 / p99 (%d created at %d/s)", m, b.p.rate),
		millis(seen[m*50/100])+" / "+millis(seen[min(m*99/100, m-1)]), "", "", true)
	return nil
}

// watchDelay creates rateObjects ConfigMaps at rate per second in the
// namespace outside the ring and returns the sorted times from each create
// request to the object arriving on the benchmark's watch: how long the API
// server itself takes to create an object and deliver it to a watch, which
// every assignment by watch pays twice (the create to the sharder, the
// label to the watch).
func (b *bench) watchDelay(ctx context.Context) ([]time.Duration, error) {
	const prefix = "seen"
	n, rate := b.p.rateObjects, b.p.rate
	starts := make([]time.Time, n)
	var wg sync.WaitGroup
	var failed atomic.Int64
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for i := range n {
		<-tick.C
		starts[i] = time.Now()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := createObject(ctx, b.c, unrelatedNamespace, objectName(prefix, i)); err != nil {
				failed.Add(1)
			}
		}()
	}
	wg.Wait()
	if f := failed.Load(); f > 0 {
		return nil, fmt.Errorf("%d creations failed", f)
	}
	lat := make([]time.Duration, n)
	err := b.waitOn(ctx, b.unrelated, time.Minute, func([]localrun.Watched) error {
		for i := range n {
			o, ok := b.unrelated.Get(unrelatedNamespace + "/" + objectName(prefix, i))
			if !ok {
				return fmt.Errorf("object %d not seen yet", i)
			}
			lat[i] = max(o.FirstSeen.Sub(starts[i]), 0)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	return lat, deleteObjects(ctx, b.c, unrelatedNamespace, prefix, 0, n, b.p.workers)
}

// admissionLatency switches the ring to assignment at admission and
// creates objects at the same rate: the create response should already
// carry the shard label.
func (b *bench) admissionLatency(ctx context.Context) error {
	if err := b.setAssignmentMode(ctx, sharderv1alpha1.AssignmentAdmission); err != nil {
		return err
	}
	// The mode is in effect once a create comes back labelled.
	probe := 0
	err := localrun.Poll(ctx, time.Minute, 100*time.Millisecond, func() error {
		probe++
		cm, err := createObject(ctx, b.c, objectNamespace, objectName("probe", probe))
		if err != nil {
			return err
		}
		if cm.Labels[sharderv1alpha1.ShardLabel(ringName)] == "" {
			return errors.New("created objects are not labelled at admission yet")
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := deleteObjects(ctx, b.c, objectNamespace, "probe", 1, probe+1, b.p.workers); err != nil {
		return err
	}
	lat, labelled, err := b.createAtRate(ctx, "admitted")
	if err != nil {
		return err
	}
	n := len(lat)
	p99 := lat[min(n*99/100, n-1)]
	b.add(fmt.Sprintf("admission mode: creates whose response carried the shard label (%d created at %d/s)", n, b.p.rate),
		fmt.Sprintf("%d of %d", labelled, n), "", "all", labelled == n)
	b.add("admission mode: create to label seen on a watch, p99", millis(p99), "", "", true)
	return b.setAssignmentMode(ctx, sharderv1alpha1.AssignmentWatch)
}

func (b *bench) setAssignmentMode(ctx context.Context, mode string) error {
	patch := fmt.Sprintf(`{"spec":{"assignment":{"mode":%q}}}`, mode)
	r := &sharderv1alpha1.ControllerRing{}
	r.Name = ringName
	return b.c.Patch(ctx, r, client.RawPatch(types.MergePatchType, []byte(patch)))
}

// createAtRate creates rateObjects ConfigMaps at rate per second, waits
// until all are assigned, deletes them again and returns the sorted
// latencies from each create request to its label on the watch, and how
// many create responses carried the shard label.
func (b *bench) createAtRate(ctx context.Context, prefix string) ([]time.Duration, int, error) {
	n, rate := b.p.rateObjects, b.p.rate
	starts := make([]time.Time, n)
	var wg sync.WaitGroup
	var failed, labelled atomic.Int64
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for i := range n {
		<-tick.C
		starts[i] = time.Now()
		wg.Add(1)
		go func() {
			defer wg.Done()
			cm, err := createObject(ctx, b.c, objectNamespace, objectName(prefix, i))
			switch {
			case err != nil:
				failed.Add(1)
			case cm.Labels[sharderv1alpha1.ShardLabel(ringName)] != "":
				labelled.Add(1)
			}
		}()
	}
	wg.Wait()
	if f := failed.Load(); f > 0 {
		return nil, 0, fmt.Errorf("%d creations failed", f)
	}
	total := b.p.objects + n
	if err := b.wait(ctx, time.Minute, localrun.AllAssigned(total)); err != nil {
		return nil, 0, err
	}
	lat := make([]time.Duration, n)
	for i := range n {
		o, ok := b.tracker.Get(objectNamespace + "/" + objectName(prefix, i))
		if !ok {
			return nil, 0, fmt.Errorf("object %d not tracked", i)
		}
		lat[i] = max(o.FirstAssigned.Sub(starts[i]), 0)
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	if err := deleteObjects(ctx, b.c, objectNamespace, prefix, 0, n, b.p.workers); err != nil {
		return nil, 0, err
	}
	return lat, int(labelled.Load()), b.wait(ctx, time.Minute, localrun.AllAssigned(b.p.objects))
}

// rebalance adds a fourth instance and measures from its Lease's
// acquisition to the last object moved, and the fraction of objects moved.
func (b *bench) rebalance(ctx context.Context) error {
	if err := b.measureStepFloor(ctx, "rebalance"); err != nil {
		return err
	}
	before := b.tracker.Assignment()
	cpu0, err := cpuTime(b.sharder.Pid())
	if err != nil {
		return err
	}
	writes0, err := b.patchesSent(ctx)
	if err != nil {
		return err
	}
	prof := b.startCPUProfile(ctx, "rebalance", b.p.profileDuration)
	machine0 := machineCPU()
	lease, err := b.startInstance(ctx, instanceID(3))
	if err != nil {
		return err
	}
	if err := b.wait(ctx, 5*time.Minute, localrun.SettledOn(configMapKind, b.p.objects, b.liveInstances()...)); err != nil {
		return err
	}
	machine := machineCPU() - machine0
	cpu1, err := cpuTime(b.sharder.Pid())
	if err != nil {
		return err
	}
	writes1, err := b.patchesSent(ctx)
	if err != nil {
		return err
	}
	after := b.tracker.Assignment()
	acquired := lease.Spec.AcquireTime.Time
	took := lastChange(b.tracker.Snapshot()).Sub(acquired)
	var first time.Time
	for _, o := range b.tracker.Snapshot() {
		if o.Instance == instanceID(3) && (first.IsZero() || o.Changed.Before(first)) {
			first = o.Changed
		}
	}
	moved := localrun.Moved(before, after)
	ok := b.addRatio(fmt.Sprintf("3 → 4 rebalance of %d objects, %d moved (from the 4th Lease's acquisition; 2 writes per move)", b.p.objects, moved),
		took, 2*moved, 1.25, "")
	arrival := first.Sub(acquired)
	b.add("3 → 4 rebalance: first object at the new instance", seconds(arrival), "", "≤ 0.2 s", arrival <= 200*time.Millisecond)
	fraction := float64(moved) / float64(len(after))
	b.add("3 → 4 moved fraction (ideal 0.250)", fmt.Sprintf("%.3f (%.2f × ideal)", fraction, fraction/0.25), "", "≤ 1.10 × ideal", fraction/0.25 <= 1.10)
	b.addCPU("rebalance", cpu1-cpu0, writes1-writes0)
	b.addMachineCPU("rebalance (the new instance's start included)", machine, 2*moved, cpu1-cpu0, b.stepFloor)
	return b.keepProfile("rebalance", prof, ok)
}

// failover kills an instance with SIGKILL and measures from its last Lease
// renewal to the first of its objects relabelled (detection), and from
// there to the last (relabelling).
func (b *bench) failover(ctx context.Context) error {
	if err := b.measureStepFloor(ctx, "fail-over"); err != nil {
		return err
	}
	victim := instanceID(1)
	var mine []string
	for _, o := range b.tracker.Snapshot() {
		if o.Instance == victim {
			mine = append(mine, o.Key)
		}
	}
	cpu0, err := cpuTime(b.sharder.Pid())
	if err != nil {
		return err
	}
	writes0, err := b.patchesSent(ctx)
	if err != nil {
		return err
	}
	b.killed[victim] = true
	if err := b.instances[victim].Kill(); err != nil {
		return err
	}
	var lease coordinationv1.Lease
	if err := b.c.Get(ctx, client.ObjectKey{Namespace: leaseNamespace, Name: victim}, &lease); err != nil {
		return err
	}
	lastRenewal := lease.Spec.RenewTime.Time
	prof := b.startCPUProfile(ctx, "fail-over", 2*b.p.leaseDuration+b.p.profileDuration/2)
	if err := b.wait(ctx, 2*time.Minute, localrun.SettledOn(configMapKind, b.p.objects, b.liveInstances()...)); err != nil {
		return err
	}
	cpu1, err := cpuTime(b.sharder.Pid())
	if err != nil {
		return err
	}
	writes1, err := b.patchesSent(ctx)
	if err != nil {
		return err
	}
	var first, last time.Time
	for _, k := range mine {
		o, _ := b.tracker.Get(k)
		if o.Changed.After(last) {
			last = o.Changed
		}
		if first.IsZero() || o.Changed.Before(first) {
			first = o.Changed
		}
	}
	d := b.p.leaseDuration
	detected := first.Sub(lastRenewal)
	// The Lease's renewTime has a resolution of a microsecond; the
	// detection may be late by the lease controller's requeue and one
	// patch's round trip.
	b.add(fmt.Sprintf("fail-over after SIGKILL: first object moved, from the last renewal (lease %s)", d),
		fmt.Sprintf("%s (2 × lease %+.2f s)", seconds(detected), (detected-2*d).Seconds()), "",
		fmt.Sprintf("2 × lease = %s (+ ≤ 0.25 s)", seconds(2*d)), detected >= 2*d && detected <= 2*d+250*time.Millisecond)
	ok := b.addRatio(fmt.Sprintf("fail-over: relabel the %d objects of the dead instance (first to last; 1 write per object)", len(mine)),
		last.Sub(first), len(mine), 1.15, "")
	// The sharder's other writes meanwhile (ring status, the Lease it
	// takes) are a handful: the figure stays one write per object.
	perObject := (writes1 - writes0) / float64(len(mine))
	b.add("fail-over: the sharder's PATCH requests per relabelled object (ring status and Leases included)",
		fmt.Sprintf("%.3f", perObject), "", "1 (+ a few)", perObject < 1.01)
	b.addCPU("fail-over", cpu1-cpu0, writes1-writes0)
	return b.keepProfile("fail-over", prof, ok)
}

// memory creates objects up to largeObjects with no sharder running,
// starts the sharder process on them and reads its peak RSS (including the
// caches' first sync) and its live heap.
func (b *bench) memory(ctx context.Context) error {
	extra := b.p.largeObjects - 2*b.p.objects
	start := time.Now()
	if err := createObjects(ctx, b.c, objectNamespace, "large", extra, b.p.workers); err != nil {
		return err
	}
	fmt.Printf("  created %d more objects in %s\n", extra, time.Since(start).Round(time.Millisecond))
	if err := b.startSharder(ctx, "sharder-large"); err != nil {
		return err
	}
	if err := b.wait(ctx, 10*time.Minute, localrun.AllAssigned(b.p.objects+extra, b.liveInstances()...)); err != nil {
		return err
	}
	large, err := b.steadyMemory(ctx)
	if err != nil {
		return err
	}
	heap, err := b.liveHeap(ctx)
	if err != nil {
		return err
	}
	cpu, err := b.idleCPU(ctx, 10*time.Second)
	if err != nil {
		return err
	}
	perObject := (heap - b.heapSmall) / float64(extra)
	b.add(fmt.Sprintf("sharder peak RSS (VmHWM), started with %d objects existing (including the caches' first sync)", b.p.largeObjects),
		mib(large.Peak), "", "< 120 MiB", large.Peak < 120<<20)
	b.add(fmt.Sprintf("sharder RSS with %d objects, steady", b.p.largeObjects), mib(large.RSS), "", "", true)
	b.add(fmt.Sprintf("sharder live heap per cached object (after GC, %d vs %d objects)", b.p.largeObjects, 2*b.p.objects),
		fmt.Sprintf("%.0f B (%s / %s)", perObject, mib(uint64(b.heapSmall)), mib(uint64(heap))), "", "≤ 400 B", perObject <= 400)
	b.add(fmt.Sprintf("sharder CPU while nothing changes (10 s, %d objects)", b.p.largeObjects), fmt.Sprintf("%.1f %% of a core", cpu*100), "", "close to 0", cpu < 0.02)
	return nil
}
