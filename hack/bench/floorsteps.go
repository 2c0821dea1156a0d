package main

import (
	"context"
	"fmt"
	"time"

	"github.com/sharder-dev/sharder/internal/localrun"
	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// The default scenario's floors: the label patches per second the API server
// accepts from this process, which its figures are ratios to.

// measureRingFloor measures the floor of the sharder's own writes with no
// sharder running: the bench writes the ring's shard label on the ring's
// objects, spread over the instances, then removes it again. These patches
// reach the same watches as the sharder's (each instance's, the bench's
// tracker), so the API server does the same work per write as for the
// sharder's, apart from the sharder's own watch. The writer authenticates
// as the sharder does in this bench: both are in system:masters, so API
// Priority and Fairness exempts both alike. Ratios are to the labelling
// pass.
func (b *bench) measureRingFloor(ctx context.Context) error {
	n := min(b.p.floorPatches, b.p.objects)
	shard := sharderv1alpha1.ShardLabel(ringName)
	instances := b.liveInstances()
	if err := b.settle(ctx); err != nil {
		return err
	}
	set, err := b.patcher.measureLabels(ctx, "no sharder running (3 instances), the ring's shard label set on the ring's objects",
		objectNamespace, ringObjectPrefix, shard, n, func(i int) string { return instances[i%len(instances)] })
	if err != nil {
		return err
	}
	b.floors = append(b.floors, set)
	fmt.Printf("  floor, %s: %s\n", set.name, set)
	removed, err := b.patcher.measureLabels(ctx, "no sharder running (3 instances), the ring's shard label removed again",
		objectNamespace, ringObjectPrefix, shard, n, func(int) string { return "" })
	if err != nil {
		return err
	}
	b.floors = append(b.floors, removed)
	fmt.Printf("  floor, %s: %s\n", removed.name, removed)
	b.ringFloor = set
	// The sharder starts on unlabelled objects, as before.
	if err := b.wait(ctx, time.Minute, func(objs []localrun.Watched) error {
		for _, o := range objs {
			if o.Instance != "" {
				return fmt.Errorf("object %s still labelled", o.Key)
			}
		}
		return nil
	}); err != nil {
		return err
	}
	return b.settle(ctx)
}

// measureStepFloor measures the floor again just before a step, with the
// sharder running: the ring's shard label set on the objects of the
// namespace outside the ring (spread over the live instances), then
// removed again. These writes reach the same watches as the sharder's
// (the instance's, the benchmark's, and the sharder's own, which ignores
// them outside the ring's namespaces), and the rate of the API server on a
// busy machine moves by a factor of two within minutes: the step's ratio
// is to this floor.
func (b *bench) measureStepFloor(ctx context.Context, step string) error {
	n := min(b.p.floorPatches, b.p.objects)
	shard := sharderv1alpha1.ShardLabel(ringName)
	instances := b.liveInstances()
	if err := b.settle(ctx); err != nil {
		return err
	}
	before, err := cpuTime(b.sharder.Pid())
	if err != nil {
		return err
	}
	f, err := b.patcher.measureLabels(ctx, "sharder running, just before the "+step+": the ring's shard label set outside the ring",
		unrelatedNamespace, "floor", shard, n, func(i int) string { return instances[i%len(instances)] })
	if err != nil {
		return err
	}
	after, err := cpuTime(b.sharder.Pid())
	if err != nil {
		return err
	}
	f.sharderCPU = max(after-before, time.Nanosecond) // a sharder ran
	b.floors = append(b.floors, f)
	fmt.Printf("  floor, %s: %s\n", f.name, f)
	if _, err := b.patcher.measureLabels(ctx, "removed", unrelatedNamespace, "floor", shard, n, func(int) string { return "" }); err != nil {
		return err
	}
	b.stepFloor = f
	return b.settle(ctx)
}

// measureFloor measures the floor and keeps it for the report.
func (b *bench) measureFloor(ctx context.Context, name string) (floor, error) {
	if err := b.settle(ctx); err != nil {
		return floor{}, err
	}
	var before time.Duration
	if b.sharder != nil && !b.sharder.Exited() {
		var err error
		if before, err = cpuTime(b.sharder.Pid()); err != nil {
			return floor{}, err
		}
	}
	f, err := b.patcher.measure(ctx, name, b.p.floorPatches)
	if err != nil {
		return f, err
	}
	if b.sharder != nil && !b.sharder.Exited() {
		after, err := cpuTime(b.sharder.Pid())
		if err != nil {
			return f, err
		}
		f.sharderCPU = after - before
	}
	b.floors = append(b.floors, f)
	fmt.Printf("  floor, %s: %s\n", name, f)
	return f, b.settle(ctx)
}

// idleFloor measures the floor again with the sharder running idle: the
// patches go to a namespace outside the ring, so what differs from the
// floor without the sharder is the cost of its cluster-wide watches.
func (b *bench) idleFloor(ctx context.Context) error {
	if _, err := b.steadyMemory(ctx); err != nil { // the sharder has settled
		return err
	}
	var err error
	if b.idle, err = b.measureFloor(ctx, "sharder process idle, patches outside the ring"); err != nil {
		return err
	}
	if b.heapSmall, err = b.liveHeap(ctx); err != nil {
		return err
	}
	return nil
}
