package slots

import (
	"fmt"
	"maps"
	"strconv"
	"testing"
	"time"

	"github.com/sharder-dev/sharder/pkg/membership"
)

// benchSizes are the slot counts of the benchmarks, each over 1,000
// instances.
var benchSizes = []int{256, 1024, 4096}

const benchInstances = 1000

func benchMembers(n int) []Member {
	out := make([]Member, n)
	for i := range out {
		out[i] = Member{ID: fmt.Sprintf("instance-%04d", i), Weight: 1 + i%3}
	}
	return out
}

// BenchmarkPlan: the plan of a membership change, one instance joining
// 999 whose slots are where the plan put them.
func BenchmarkPlan(b *testing.B) {
	for _, count := range benchSizes {
		b.Run(fmt.Sprintf("slots=%d/instances=%d", count, benchInstances), func(b *testing.B) {
			members := benchMembers(benchInstances)
			holders := Plan(make([]string, count), members[1:])
			b.ReportAllocs()
			for b.Loop() {
				Plan(holders, members)
			}
		})
	}
}

// BenchmarkStep: the state machine's decision over every slot on a
// membership change (an instance holding slots is dead and held: its slots
// to grant), and with nothing to do (the steady state). (One instance
// joining 999 may change nothing at 256 slots: its quota can be 0.)
func BenchmarkStep(b *testing.B) {
	for _, count := range benchSizes {
		steady := Input{Instances: map[string]Instance{}, DrainTimeout: 30 * time.Second, Now: time.Now()}
		for _, m := range benchMembers(benchInstances) {
			steady.Instances[m.ID] = Instance{State: membership.StateReady, Weight: m.Weight}
		}
		table := Step(NewTable(count), steady).Table
		change := steady
		change.Instances = maps.Clone(steady.Instances)
		change.Instances[table.Slots[0].Holder] = Instance{State: membership.StateDead, Weight: 1, Movable: true}

		b.Run(fmt.Sprintf("change/slots=%d/instances=%d", count, benchInstances), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if !Step(table, change).Changed {
					b.Fatal("an instance died and nothing changed")
				}
			}
		})
		b.Run(fmt.Sprintf("steady/slots=%d/instances=%d", count, benchInstances), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if Step(table, steady).Changed {
					b.Fatal("nothing changed and the table did")
				}
			}
		})
	}
}

// BenchmarkStatus: the table to the ring's status and back, with every
// instance's slots scattered (each holds every thousandth slot).
func BenchmarkStatus(b *testing.B) {
	for _, count := range benchSizes {
		table := NewTable(count)
		for i := range table.Slots {
			table.Slots[i] = Slot{Holder: "instance-" + strconv.Itoa(i%benchInstances)}
		}
		b.Run(fmt.Sprintf("slots=%d/instances=%d", count, benchInstances), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := FromStatus(count, table.Status()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
