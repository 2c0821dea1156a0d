// Command bench measures the sharder on a local control plane (real etcd and
// kube-apiserver) with simulated instances, prints one table and writes it,
// with the machine it ran on, to a Markdown file:
//
//	go run ./hack/bench --output docs/benchmarks.md
//
// It first measures the floor: the label patches per second the API server
// accepts from this process, with the sharder stopped and again with it
// running idle. Then it measures the time to assign pre-existing objects
// after the sharder starts, the assignment latency of objects created at a
// steady rate (by watch and at admission), a 3 → 4 instance rebalance, the
// fail-over after an instance is killed, the same first figure with the
// sharder running inside this process, and the sharder's memory when it
// starts with 50,000 objects. Times are reported as ratios to the floor.
//
// --step runs only the named steps (the initial assignment always runs: it
// starts the instances and the sharder), e.g. to measure one figure with
// the sharder's profiling endpoint at hand:
//
//	go run ./hack/bench --step rebalance --keep
//
// --scale measures one ring of many instances instead (make bench-scale),
// their Leases held by this process: the sharder's CPU while every Lease
// renews, and for one instance added, one stopped and one killed, the time
// to the first object moved and the sharder's CPU for the change:
//
//	go run ./hack/bench --scale --instances 1000 --algorithm consistent-hash-dense --output docs/benchmarks-scale.md
//
// --slots measures one ring of unit Slots instead (make bench-slots): its
// objects labelled by the assigning webhook, in-process instances of
// pkg/instance in slot mode, the writes and hand-over times of a scale-out,
// a stop and a rolling restart, and the sharder's RSS at two object counts:
//
//	go run ./hack/bench --slots --objects 10000 --large-objects 50000 --output docs/benchmarks-slots.md
//
// Otherwise, simulated instances are processes of this program (`bench
// instance`): each holds its instance Lease and acknowledges drains at once
// through the instance library, reconciling nothing else.
//
// Each of these benchmarks is a scenario (scenario.go): its mode flag, its
// defaults, its set-up, its measured steps and its report, run by one
// runner.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"
	"time"

	"github.com/sharder-dev/sharder/pkg/sharder/config"
)

// defaultLeaseDuration is the simulated instances' lease duration unless
// --lease-duration says otherwise.
const defaultLeaseDuration = 5 * time.Second

func main() {
	if len(os.Args) > 1 && os.Args[1] == instanceCommand {
		if err := runInstance(os.Args[2:]); err != nil {
			fmt.Fprintf(os.Stderr, "bench instance: %v\n", err)
			os.Exit(1)
		}
		return
	}
	var p params
	flag.StringVar(&p.output, "output", "", "Markdown file to write the results to (e.g. docs/benchmarks.md); empty: print only")
	flag.StringVar(&p.dir, "dir", "", "folder for the run's kubeconfigs, binaries and logs (default: a new temporary folder)")
	flag.BoolVar(&p.keep, "keep", false, "keep the run's folder (logs) afterwards")
	flag.IntVar(&p.objects, "objects", 10000, "pre-existing objects")
	flag.IntVar(&p.largeObjects, "large-objects", 50000, "objects for the second memory figure")
	flag.IntVar(&p.rate, "rate", 100, "creations per second for the latency figure")
	flag.IntVar(&p.rateObjects, "rate-objects", 1000, "objects created at --rate")
	flag.IntVar(&p.floorPatches, "floor-patches", 4000, "label patches per floor measurement (at most --objects)")
	flag.IntVar(&p.floorWorkers, "floor-workers", config.DefaultAssignmentWorkers, "concurrent writers of the floor measurement; set it to the sharder's --assignment-workers")
	flag.DurationVar(&p.profileDuration, "profile-duration", 10*time.Second, "length of the sharder's CPU profiles")
	flag.DurationVar(&p.leaseDuration, "lease-duration", defaultLeaseDuration, "lease duration of the simulated instances (--scale: 15s unless set)")
	flag.BoolVar(&p.scale, "scale", false, "measure one ring of --instances instances instead (make bench-scale); of the other flags only --algorithm, --output, --dir, --keep, --objects, --create-workers, --profile-duration, --lease-duration, --sharder-arg and --sharder-env apply")
	flag.IntVar(&p.instances, "instances", 1000, "--scale: instances in the ring, their Leases held by this process")
	flag.StringVar(&p.algorithm, "algorithm", "", "the ring's spec.algorithm (empty: the API's default); the normal mode's figures assume the default")
	flag.DurationVar(&p.steady, "steady-duration", time.Minute, "--scale: length of the steady CPU measurement")
	flag.IntVar(&p.workers, "create-workers", 32, "parallel requests when creating objects")
	flag.BoolVar(&p.manyObjects, "many-objects", false, "measure one ring of --objects objects instead (make bench-objects), --instances instances (default 10) whose Leases this process holds; of the other flags only --algorithm, --output, --dir, --keep, --watched-objects, --create-workers, --profile-duration, --lease-duration, --sharder-arg and --sharder-env apply")
	flag.IntVar(&p.watchedObjects, "watched-objects", 100000, "--many-objects: objects created without a label before the sharder starts, assigned from its watch")
	flag.IntVar(&p.admittedObjects, "admitted-objects", 20000, "--many-objects: objects created through the sharder's assigning webhook once it runs; the rest of --objects are created before, with the label the webhook gives")
	flag.Func("sharder-arg", "extra argument for `sharder run` (repeatable), e.g. --sharder-arg=--kube-api-qps=1000", func(s string) error {
		p.sharderArgs = append(p.sharderArgs, s)
		return nil
	})
	flag.Func("sharder-env", "extra environment variable NAME=VALUE for the sharder process only (repeatable), e.g. --sharder-env=GOGC=50", func(s string) error {
		p.sharderEnv = append(p.sharderEnv, s)
		return nil
	})
	flag.Func("step", "run only this step (repeatable; the steps' names as printed, e.g. --step=\"initial assignment\"); default: every step", func(s string) error {
		p.steps = append(p.steps, s)
		return nil
	})
	flag.BoolVar(&p.slots, "slots", false, "measure one ring of unit Slots in admission mode instead (make bench-slots): --objects objects, --instances in-process instances (default 3) in slot mode, scale-out, a stop and a rolling restart, then the sharder's RSS again with --large-objects objects; of the other flags only --output, --dir, --keep, --objects, --existing-objects, --large-objects, --create-workers, --lease-duration, --slot-count, --sharder-arg and --sharder-env apply")
	flag.IntVar(&p.slotCount, "slot-count", 256, "--slots: the ring's spec.assignment.slots.count")
	flag.IntVar(&p.existingObjects, "existing-objects", 0, "--slots: objects created before the sharder and the instances start, with the slot label the assigning webhook gives (for sizes whose admissions would take hours); --objects more are then created through the webhook")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of this benchmark process (not of the sharder) to the file")
	flag.Parse()
	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	s, err := chooseScenario(&p, func(name string) bool { return set[name] })
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		os.Exit(2)
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench: %v\n", err)
			os.Exit(1)
		}
	}

	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err = runScenario(ctx, s, p)
	cancel()
	pprof.StopCPUProfile() // does nothing unless --cpuprofile started one
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		os.Exit(1)
	}
}
