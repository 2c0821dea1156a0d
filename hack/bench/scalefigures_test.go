package main

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/sharder-dev/sharder/internal/localrun"
	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/ring"
)

func TestFirstMove(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	on := func(id string) labelState { return labelState{instance: id} }
	draining := func(id string) labelState { return labelState{instance: id, draining: true} }
	events := []labelEvent{
		{at: at(0), key: "a", from: on("x"), to: on("y")},          // before the change
		{at: at(10), key: "b", from: labelState{}, to: on("x")},    // a first assignment moves nothing
		{at: at(20), key: "c", from: on("y"), to: draining("y")},   // a drain of another instance
		{at: at(30), key: "d", from: on("x"), to: draining("x")},   // the first drain of x
		{at: at(40), key: "d", from: draining("x"), to: on("z")},   // its hand-over
		{at: at(50), key: "e", from: on("x"), to: labelState{}},    // unassigned
		{at: at(60), key: "f", from: draining("y"), to: on("new")}, // arrives on new
	}
	tests := []struct {
		name   string
		since  time.Time
		from   map[string]bool
		wantAt time.Time
		wantOK bool
	}{
		{"any instance", at(5), nil, at(20), true},
		{"from x", at(5), map[string]bool{"x": true}, at(30), true},
		{"from x, after its drain", at(35), map[string]bool{"x": true}, at(40), true},
		{"none after the last", at(70), nil, time.Time{}, false},
		{"from an instance that never moved", at(0), map[string]bool{"w": true}, time.Time{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			e, ok := firstMove(events, tt.since, tt.from)
			g.Expect(ok).To(Equal(tt.wantOK))
			g.Expect(e.at).To(Equal(tt.wantAt))
		})
	}
	g := NewWithT(t)
	e, ok := firstArrival(events, at(5), "new")
	g.Expect(ok).To(BeTrue())
	g.Expect(e.key).To(Equal("f"))
	_, ok = firstArrival(events, at(5), "w")
	g.Expect(ok).To(BeFalse())
}

func TestCPUAbove(t *testing.T) {
	g := NewWithT(t)
	// 10 s at 5 % of a core is 500 ms anyway.
	g.Expect(cpuAbove(700*time.Millisecond, 10*time.Second, 0.05)).To(Equal(200 * time.Millisecond))
	g.Expect(cpuAbove(400*time.Millisecond, 10*time.Second, 0.05)).To(Equal(time.Duration(0)))
	g.Expect(cpuAbove(300*time.Millisecond, 10*time.Second, 0)).To(Equal(300 * time.Millisecond))
}

func TestRenewedWithin(t *testing.T) {
	g := NewWithT(t)
	now := time.Date(2026, 1, 1, 0, 1, 0, 0, time.UTC)
	renewals := []time.Time{now.Add(-time.Second), now.Add(-6 * time.Second), now.Add(-5 * time.Second), {}}
	g.Expect(renewedWithin(renewals, now, 5*time.Second)).To(Equal(2))
}

func TestSettledOn(t *testing.T) {
	instances := []string{"instance-0", "instance-1", "instance-2"}
	for _, algorithm := range []string{"", sharderv1alpha1.AlgorithmConsistentHashDense} {
		t.Run(algorithm, func(t *testing.T) {
			g := NewWithT(t)
			members := make([]ring.Member, len(instances))
			for i, id := range instances {
				members[i] = ring.Member{ID: id, VirtualNodes: sharderv1alpha1.DefaultVirtualNodes}
			}
			r, err := ring.New(algorithm, members)
			g.Expect(err).NotTo(HaveOccurred())
			var objs []localrun.Watched
			for i := range 30 {
				key := objectNamespace + "/" + objectName(ringObjectPrefix, i)
				id, err := r.Lookup(ring.ObjectKey("", "ConfigMap", objectNamespace, objectName(ringObjectPrefix, i)))
				g.Expect(err).NotTo(HaveOccurred())
				objs = append(objs, localrun.Watched{ObjectState: localrun.ObjectState{Key: key, Instance: id}})
			}
			g.Expect(settledOn(algorithm, len(objs), instances)(objs)).To(Succeed())
			g.Expect(settledOn(algorithm, len(objs)+1, instances)(objs)).To(MatchError(ContainSubstring("objects tracked")))

			objs[3].Draining = true
			g.Expect(settledOn(algorithm, len(objs), instances)(objs)).To(MatchError(ContainSubstring("1 of 30")))
			objs[3].Draining = false
			objs[4].Instance = "instance-9"
			g.Expect(settledOn(algorithm, len(objs), instances)(objs)).To(MatchError(ContainSubstring("1 of 30")))
		})
	}
}
