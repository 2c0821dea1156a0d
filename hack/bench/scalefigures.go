package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/sharder-dev/sharder/internal/localrun"
	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/ring"
)

// firstMove returns the first event at or after since that moved an object
// away from one of from (any instance when from is nil): its drain label
// set, or its shard label changed from that instance to another. The
// events are in the order they arrived. ok is false when there is none.
func firstMove(events []labelEvent, since time.Time, from map[string]bool) (labelEvent, bool) {
	for _, e := range events {
		if e.at.Before(since) || e.from.instance == "" {
			continue
		}
		if from != nil && !from[e.from.instance] {
			continue
		}
		drained := e.to.draining && !e.from.draining
		relabelled := e.to.instance != e.from.instance
		if drained || relabelled {
			return e, true
		}
	}
	return labelEvent{}, false
}

// firstArrival returns the first event at or after since that put an
// object on instance to (its shard label changed to it).
func firstArrival(events []labelEvent, since time.Time, to string) (labelEvent, bool) {
	for _, e := range events {
		if !e.at.Before(since) && e.to.instance == to && e.from.instance != to {
			return e, true
		}
	}
	return labelEvent{}, false
}

// cpuAbove returns the CPU time spent over a window beyond the steady rate
// (cores) that would have been spent anyway over the window's length, never
// below zero.
func cpuAbove(cpu, window time.Duration, steady float64) time.Duration {
	return max(cpu-time.Duration(steady*float64(window)), 0)
}

// renewedWithin counts the renew times no older than d at now.
func renewedWithin(renewals []time.Time, now time.Time, d time.Duration) int {
	n := 0
	for _, t := range renewals {
		if !t.IsZero() && now.Sub(t) <= d {
			n++
		}
	}
	return n
}

// settledOn is a LabelWatch.Wait condition: n objects, each on the
// instance a ring of instances (default weights) built with algorithm
// ("" for the default) assigns it to, none draining. It builds the ring
// once and looks each object up once.
func settledOn(algorithm string, n int, instances []string) func([]localrun.Watched) error {
	var r ring.Ring
	want := map[string]string{}
	return func(objs []localrun.Watched) error {
		if len(objs) != n {
			return fmt.Errorf("%d objects tracked, want %d", len(objs), n)
		}
		if r == nil {
			members := make([]ring.Member, len(instances))
			for i, id := range instances {
				members[i] = ring.Member{ID: id, VirtualNodes: sharderv1alpha1.DefaultVirtualNodes}
			}
			var err error
			if r, err = ring.New(algorithm, members); err != nil {
				return err
			}
		}
		wrong := 0
		first := ""
		for _, o := range objs {
			id, ok := want[o.Key]
			if !ok {
				ns, name, _ := strings.Cut(o.Key, "/")
				var err error
				if id, err = r.Lookup(ring.ObjectKey(configMapKind.Group, configMapKind.Kind, ns, name)); err != nil {
					return err
				}
				want[o.Key] = id
			}
			if o.Draining || o.Instance != id {
				if wrong++; first == "" {
					first = fmt.Sprintf("%s on %q (draining %t), want %s", o.Key, o.Instance, o.Draining, id)
				}
			}
		}
		if wrong > 0 {
			return fmt.Errorf("%d of %d objects not on their instance among %d, e.g. %s", wrong, len(objs), len(instances), first)
		}
		return nil
	}
}
