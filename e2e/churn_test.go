package e2e

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ChurnInput configures ChurnSpec.
type ChurnInput struct {
	// Instances at the start.
	Instances int
	// Objects at the start.
	Objects int
	// Duration of the churn.
	Duration time.Duration
	// Interval between two object operations.
	Interval time.Duration
	// Timeout bounds the final waits.
	Timeout time.Duration
	// Slots, when not 0, makes the ring one of unit Slots with this many
	// slots (docs/design.md §11): the churn then moves slots, and the end
	// is checked on the slot table.
	Slots int
}

// ChurnSpec creates, updates and deletes EtcdClusters while instances join,
// leave gracefully and die, and while the Lease of a running instance is
// deleted and another's ring label removed (the instance is then not proven
// gone: the sharder holds its objects while it stops; having lost its Lease
// it exits, is restarted as its pod would be, and comes back under the same
// ID). Afterwards no two instances ever reconciled one object at the same
// time, every object sits on a live instance (the one the ring chooses) and
// was reconciled by it after its last change. In a ring of unit Slots, every
// slot is granted to a live instance, no table the sharder wrote granted a
// slot twice, and every object was reconciled after its last change by its
// slot's holder.
func ChurnSpec(t *testing.T, in ChurnInput) {
	e := newRingEnv(t, ringOptions{Slots: in.Slots})
	var w *slotWatch
	if in.Slots > 0 {
		w = newSlotWatch(e, in.Slots)
	}
	settle := func(n int) {
		if w != nil {
			w.waitSettled(n, in.Timeout, e.liveInstances()...)
			return
		}
		e.waitSettled(n, in.Timeout, e.liveInstances()...)
	}
	e.startInstances(in.Instances)
	e.startSharders()
	alive := map[string]bool{}
	for _, k := range e.createClusters("obj", in.Objects) {
		alive[k[len(e.namespace)+1:]] = true
	}
	settle(in.Objects)

	// Membership changes at fixed points of the run.
	next := in.Instances
	events := []struct {
		at time.Duration
		do func()
	}{
		{in.Duration / 5, func() { e.startInstance(fmt.Sprintf("instance-%d", next)); next++ }},
		{2 * in.Duration / 5, func() { e.stopInstance("instance-0") }},
		{in.Duration / 2, func() { e.deleteLease("instance-2") }},
		{3 * in.Duration / 5, func() { e.killInstance("instance-1") }},
		{7 * in.Duration / 10, func() { e.unlabelLease(fmt.Sprintf("instance-%d", in.Instances)) }},
		{4 * in.Duration / 5, func() { e.startInstance(fmt.Sprintf("instance-%d", next)); next++ }},
		{9 * in.Duration / 10, func() { e.startInstance(fmt.Sprintf("instance-%d", next)); next++ }},
	}

	rng := rand.New(rand.NewPCG(1, 2))
	created := in.Objects
	start := time.Now()
	tick := time.NewTicker(in.Interval)
	defer tick.Stop()
	for time.Since(start) < in.Duration {
		<-tick.C
		for len(events) > 0 && time.Since(start) >= events[0].at {
			events[0].do()
			events = events[1:]
		}
		names := make([]string, 0, len(alive))
		for n := range alive {
			names = append(names, n)
		}
		switch op := rng.IntN(10); {
		case op < 3 || len(names) == 0:
			name := fmt.Sprintf("obj-%03d", created)
			created++
			e.g.Expect(e.c.Create(e.ctx, e.newCluster(name))).To(gomega.Succeed())
			alive[name] = true
		case op < 8:
			name := names[rng.IntN(len(names))]
			patch := []byte(fmt.Sprintf(`{"spec":{"advanced":{"etcdConfig":{"snapshot-count":"%d"}}}}`, 10000+rng.IntN(90000)))
			e.g.Expect(ignoreGone(e.c.Patch(e.ctx, e.newCluster(name), client.RawPatch(types.MergePatchType, patch)))).To(gomega.Succeed())
		default:
			name := names[rng.IntN(len(names))]
			e.g.Expect(ignoreGone(e.c.Delete(e.ctx, e.newCluster(name)))).To(gomega.Succeed())
			delete(alive, name)
		}
	}
	for _, ev := range events {
		ev.do()
	}

	settle(len(alive))
	if w != nil {
		w.expectReconciledByHolder(in.Timeout)
		e.g.Expect(w.violations()).To(gomega.BeEmpty(), "tables the sharder wrote")
	} else {
		e.expectReconciledByOwner(in.Timeout)
	}
	ivs := e.expectNoOverlap()
	t.Logf("churn: %d objects created, %d alive, %d reconciles checked, instances now %v, restarted %v", created, len(alive), len(ivs), e.liveInstances(), e.restartCounts())
}

func TestChurn(t *testing.T) {
	ChurnSpec(t, ChurnInput{Instances: 3, Objects: 60, Duration: 30 * time.Second, Interval: 50 * time.Millisecond, Timeout: 90 * time.Second})
}

// TestSlotChurn is TestChurn in a ring of unit Slots.
func TestSlotChurn(t *testing.T) {
	ChurnSpec(t, ChurnInput{Instances: 3, Objects: 60, Duration: 30 * time.Second, Interval: 50 * time.Millisecond, Timeout: 90 * time.Second, Slots: 64})
}
