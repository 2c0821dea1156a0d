package ring_test

import (
	"fmt"
	"testing"

	"github.com/sharder-dev/sharder/pkg/ring"
	"github.com/sharder-dev/sharder/pkg/sharder/simulation"
)

// Figures for users choosing an algorithm and a weight, for
//
//	go test ./pkg/ring -run '^$' -bench . -benchtime 1x
//
// BenchmarkBalance reports, for 20,000 keys on N equally weighted instances
// named like StatefulSet pods: maxOverMean and minOverMean (largest and
// smallest share over the mean), and for adding an (N+1)th instance and for
// removing one, the keys moved over the fewest that must move
// (addMoved/ideal, removeMoved/ideal; 1.0 is optimal).
var (
	benchInstances = []int{3, 5, 10, 20, 50}
	// Virtual nodes per instance for consistent-hash; the weight does not
	// change the other algorithms' results when all weights are equal.
	benchVirtualNodes = []int{128, 512, 1024}
	// Sizes consistent-hash-dense is built for, beyond benchInstances, for
	// it and for consistent-hash: BenchmarkBuild and BenchmarkLookup only
	// (20,000 keys are too few to measure balance there; sharder simulate
	// --sweep does).
	benchLargeInstances = []int{100, 1000}
)

const benchKeys = 20000

type benchCase struct {
	name         string
	algorithm    string
	instances    int
	virtualNodes int
	large        bool // not for BenchmarkBalance
}

func benchCases() []benchCase {
	var cases []benchCase
	for _, alg := range builtins {
		for _, n := range benchInstances {
			vnodes := []int{512}
			if alg == ring.ConsistentHash {
				vnodes = benchVirtualNodes
			}
			for _, v := range vnodes {
				name := fmt.Sprintf("%s/instances=%d", alg, n)
				if alg == ring.ConsistentHash {
					name += fmt.Sprintf("/vnodes=%d", v)
				}
				cases = append(cases, benchCase{name: name, algorithm: alg, instances: n, virtualNodes: v})
			}
		}
		for _, n := range benchLargeInstances {
			name := fmt.Sprintf("%s/instances=%d", alg, n)
			switch alg {
			case ring.ConsistentHash:
				name += "/vnodes=512"
			case ring.ConsistentHashDense:
			default:
				continue
			}
			cases = append(cases, benchCase{name: name, algorithm: alg, instances: n, virtualNodes: 512, large: true})
		}
	}
	return cases
}

func BenchmarkBalance(b *testing.B) {
	keys := simulation.Keys(benchKeys, 1)
	for _, c := range benchCases() {
		if c.large {
			continue
		}
		b.Run(c.name, func(b *testing.B) {
			var add, remove *simulation.Result
			for b.Loop() {
				var err error
				opts := simulation.Options{Algorithm: c.algorithm, Instances: c.instances, VirtualNodes: c.virtualNodes, Keys: keys, Add: 1}
				if add, err = simulation.Run(opts); err != nil {
					b.Fatal(err)
				}
				opts.Add, opts.Remove = 0, 1
				if remove, err = simulation.Run(opts); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(add.MaxOverMean, "maxOverMean")
			b.ReportMetric(add.MinOverMean, "minOverMean")
			b.ReportMetric(add.MovedFraction/add.IdealMovedFraction, "addMoved/ideal")
			b.ReportMetric(remove.MovedFraction/remove.IdealMovedFraction, "removeMoved/ideal")
		})
	}
}

func BenchmarkLookup(b *testing.B) {
	keys := simulation.Keys(4096, 2)
	for _, c := range benchCases() {
		b.Run(c.name, func(b *testing.B) {
			r := mustNew(b, c.algorithm, members("instance", c.instances, c.virtualNodes))
			i := 0
			for b.Loop() {
				if _, err := r.Lookup(keys[i&4095]); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}

// BenchmarkBuild also reports cpu-ns/op, the process's CPU time per build
// (the garbage collector's included): on a machine shared with other work,
// the wall time (ns/op) includes the time other processes held the cores.
func BenchmarkBuild(b *testing.B) {
	for _, c := range benchCases() {
		b.Run(c.name, func(b *testing.B) {
			ms := members("instance", c.instances, c.virtualNodes)
			cpu := processCPU()
			for b.Loop() {
				if _, err := ring.New(c.algorithm, ms); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(processCPU()-cpu)/float64(b.N), "cpu-ns/op")
		})
	}
}

// BenchmarkDerive reports the time and CPU of a ring of 1,000 instances
// derived from the one before after an instance joins or leaves
// (ring.NewFrom), beside BenchmarkBuild's build from nothing.
func BenchmarkDerive(b *testing.B) {
	ms := members("instance", 1000, 512)
	prev := mustNew(b, ring.ConsistentHashDense, ms)
	for _, c := range []struct {
		name    string
		members []ring.Member
	}{
		{"joined", append(ms[:len(ms):len(ms)], ring.Member{ID: "instance-new", VirtualNodes: 512})},
		{"left", ms[1:]},
	} {
		b.Run(fmt.Sprintf("%s/instances=1000/%s", ring.ConsistentHashDense, c.name), func(b *testing.B) {
			cpu := processCPU()
			for b.Loop() {
				if _, err := ring.NewFrom(ring.ConsistentHashDense, prev, c.members); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(processCPU()-cpu)/float64(b.N), "cpu-ns/op")
		})
	}
}
