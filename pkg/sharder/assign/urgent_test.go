package assign

import (
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/utils/clock"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/sharder/assign/internal/metacache"
	"github.com/sharder-dev/sharder/pkg/sharder/ringbuilds"
)

// urgencyFixture is a ring assigner with a view of four instances (a and b
// ready, c dead, d expired) and objects in every situation the queue meets.
type urgencyFixture struct {
	r    *ringAssigner
	view *ringView
	cfg  *ringConfig
	gk   schema.GroupKind
	objs []*metacache.Object
}

func newUrgencyFixture(tb testing.TB, members []membership.Member) *urgencyFixture {
	tb.Helper()
	cfg := &ringConfig{name: "r", algorithm: v1alpha1.AlgorithmConsistentHash, virtualNodes: 16, drainTimeout: time.Minute}
	r := &ringAssigner{
		c:          &Controller{opts: Options{Clock: clock.RealClock{}, Rings: &ringbuilds.Builds{}}},
		name:       cfg.name,
		shardLabel: v1alpha1.ShardLabel(cfg.name),
		drainLabel: v1alpha1.DrainLabel(cfg.name),
		drains:     newDrainTimes(clock.RealClock{}),
	}
	view, _, err := buildView(r.c.opts.Rings, cfg, members)
	if err != nil {
		tb.Fatal(err)
	}
	f := &urgencyFixture{r: r, view: view, cfg: cfg, gk: schema.GroupKind{Kind: "ConfigMap"}}
	shards := []string{"", "a", "b", "c", "d", "gone-unknown"}
	drains := []string{"", "true", "a", "b"} // no drain label, a drain with no target, drains naming a target
	for i := range 400 {
		labels := map[string]string{}
		if s := shards[i%len(shards)]; s != "" {
			labels[r.shardLabel] = s
		}
		if d := drains[(i/len(shards))%len(drains)]; d != "" {
			labels[r.drainLabel] = d
		}
		uid := types.UID(fmt.Sprintf("uid-%d", i))
		if i%7 == 0 {
			// A forced move whose grace passed long ago, and one that is
			// still in its grace.
			r.drains.Begin(uid)
		}
		f.objs = append(f.objs, &metacache.Object{Name: fmt.Sprintf("cm-%d", i), Namespace: "ns", UID: uid, ResourceVersion: "1", Labels: labels})
	}
	return f
}

func fixtureMembers(states ...membership.State) []membership.Member {
	ids := []string{"a", "b", "c", "d"}
	out := make([]membership.Member, len(states))
	for i, s := range states {
		out[i] = membership.Member{ID: ids[i], State: s, Movable: s.Gone()}
	}
	return out
}

// TestUrgentObjectAgreesWithDecide: the work queue's urgency check answers
// what the full decision answers, for every situation.
func TestUrgentObjectAgreesWithDecide(t *testing.T) {
	for name, tc := range map[string]struct {
		members []membership.Member
	}{
		"ready, dead and expired instances": {fixtureMembers(membership.StateReady, membership.StateReady, membership.StateDead, membership.StateExpired)},
		"orphaned and uncertain instances":  {fixtureMembers(membership.StateReady, membership.StateOrphaned, membership.StateUncertain, membership.StateVanished)},
		"no ready instance":                 {fixtureMembers(membership.StateExpired, membership.StateDead)},
		"no instance at all":                {nil},
	} {
		t.Run(name, func(t *testing.T) {
			f := newUrgencyFixture(t, tc.members)
			counts := sets.New[bool]()
			for _, obj := range f.objs {
				s, err := f.r.situation(f.view, f.cfg, f.gk, obj)
				if err != nil {
					t.Fatal(err)
				}
				want := decide(s).action.urgent()
				if got := f.r.urgentObject(f.view, f.cfg, f.gk, obj); got != want {
					t.Errorf("%s with labels %v: urgent = %t, decide says %s", obj.Name, obj.Labels, got, decide(s).action)
				}
				counts.Insert(want)
			}
			if len(tc.members) > 0 && tc.members[0].State.Ready() && counts.Len() != 2 {
				t.Errorf("the fixture should hold urgent and other objects, has only urgent=%v", counts.UnsortedList())
			}
		})
	}
}

// BenchmarkUrgentObject is the urgency check the work queue runs for every
// object it takes in, over a mix of situations.
func BenchmarkUrgentObject(b *testing.B) {
	f := newUrgencyFixture(b, fixtureMembers(membership.StateReady, membership.StateReady, membership.StateDead, membership.StateExpired))
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		f.r.urgentObject(f.view, f.cfg, f.gk, f.objs[i%len(f.objs)])
	}
}

// BenchmarkSituationDecide is what a membership change costs per cached
// object of the ring (rebuild): its situation and the decision about it.
func BenchmarkSituationDecide(b *testing.B) {
	f := newUrgencyFixture(b, fixtureMembers(membership.StateReady, membership.StateReady, membership.StateDead, membership.StateExpired))
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		s, err := f.r.situation(f.view, f.cfg, f.gk, f.objs[i%len(f.objs)])
		if err != nil {
			b.Fatal(err)
		}
		decide(s)
	}
}
