package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

// A scenario is one benchmark of this command, as data: the runner
// (runScenario) starts a local control plane, prepares the scenario's run,
// runs its measured steps in order and prints and writes its report. Every
// scenario but the default one is chosen by a flag of its own (its mode).
type scenario struct {
	// mode is the flag that chooses the scenario ("" for the default one,
	// which runs when no mode flag is set).
	mode string
	// chosen tells whether the flags choose the scenario.
	chosen func(p params) bool
	// configure applies the scenario's defaults to the flags the command
	// line left unset (set tells which it set) and checks them: an error
	// is a usage error.
	configure func(p *params, set func(name string) bool) error
	// folder is the prefix of the run's temporary folder.
	folder string
	// prepare sets the run's parameters and this process's logger before
	// the control plane starts.
	prepare func(p *params)
	// setUp makes the scenario's run on the started control plane, before
	// its steps; its release runs once they ended.
	setUp func(ctx context.Context, b *bench) (scenarioRun, error)
	// announce prints the line that starts a step, at elapsed since the
	// run started.
	announce func(step string, elapsed time.Duration)
	// skip tells whether the flags leave a step out; nil: none.
	skip func(p params, step string) bool
	// reportEachStep writes the report after every step too: a long run
	// stopped early keeps the figures it has.
	reportEachStep bool
	// write writes the report to the file of --output.
	write func(p params, report string) error
}

// scenarioRun is a scenario's run on one control plane.
type scenarioRun struct {
	// steps are the measured steps, in order.
	steps []step
	// report renders what the steps measured (the report's table and notes).
	report func() string
	// release stops what the run started beside the control plane; nil:
	// nothing.
	release func()
}

// step is one measured step of a scenario.
type step struct {
	name string
	fn   func(context.Context) error
}

// The scenarios, in the order the flags choose them in.
var scenarios = []scenario{
	{
		// --scale: one ring of many instances, their Leases held by this
		// process (scale.go).
		mode:   "scale",
		chosen: func(p params) bool { return p.scale },
		configure: func(p *params, set func(string) bool) error {
			if !set("lease-duration") {
				p.leaseDuration = 15 * time.Second // the instance library's default
			}
			if p.instances < 3 || p.leaseDuration < 3*time.Second || p.leaseDuration%time.Second != 0 {
				return errors.New("--scale needs at least 3 --instances and a --lease-duration of whole seconds, at least 3s")
			}
			return nil
		},
		folder: "sharder-bench-scale-",
		prepare: func(p *params) {
			// The holders log through controller-runtime's logger; the
			// figures are what this mode reports.
			ctrl.SetLogger(logr.Discard())
			// A thousand renewals every 5 s keep the API server busy: with
			// localrun's short leader election timings (4 s) the sharder
			// may lose its leadership, and exit, on a loaded machine.
			// These are client-go's defaults.
			p.leaderLease = 15 * time.Second
			p.revision = sourceRevision() // before the build, which reads the working tree
		},
		setUp: func(_ context.Context, b *bench) (scenarioRun, error) {
			s := &scale{bench: b}
			return scenarioRun{
				steps: []step{
					{"set-up", s.setUp},
					{"initial assignment", s.initialAssignment},
					{"steady renewals", s.steadyRenewals},
					{"instance added", s.added},
					{"instance stopped", s.stopped},
					{"instance killed", s.killedInstance},
				},
				report:  s.report,
				release: func() { killFleet(s.fleet) },
			}, nil
		},
		announce: func(step string, _ time.Duration) { fmt.Printf("%s ...\n", step) },
		write:    writeScaleReport,
	},
	{
		// --many-objects: one ring of many objects and a few instances,
		// their Leases held by this process (objects.go).
		mode:   "many-objects",
		chosen: func(p params) bool { return p.manyObjects },
		configure: func(p *params, set func(string) bool) error {
			if !set("lease-duration") {
				p.leaseDuration = 15 * time.Second // the instance library's default
			}
			if !set("instances") {
				p.instances = 10
			}
			if !set("profile-duration") {
				p.profileDuration = 20 * time.Second
			}
			if p.watchedObjects < 1 || p.admittedObjects < 1 || p.objects < p.watchedObjects+p.admittedObjects+unassignedAtRestart || p.leaseDuration < 3*time.Second {
				return fmt.Errorf("--many-objects needs --watched-objects and --admitted-objects of at least 1, --objects at least %d above their sum, and a --lease-duration of at least 3s", unassignedAtRestart)
			}
			return nil
		},
		folder: "sharder-bench-objects-",
		prepare: func(p *params) {
			ctrl.SetLogger(logr.Discard())
			p.leaderLease = 15 * time.Second // client-go's defaults: the machine is busy
			p.revision = sourceRevision()
			p.apiServerFlags, p.etcdFlags = objectsAPIServerFlags, objectsEtcdFlags
		},
		setUp: func(_ context.Context, b *bench) (scenarioRun, error) {
			o := &objectsRun{bench: b, unassigned: map[string]bool{}}
			return scenarioRun{
				steps: []step{
					{"set-up", o.setUp},
					{"first start", o.firstStart},
					{"creation in admission mode", o.admissionCreation},
					{"restart", o.restart},
					{"API server", o.apiServer},
					{"scale-out", o.scaleOut},
				},
				report:  o.report,
				release: func() { killFleet(o.fleet) },
			}, nil
		},
		announce:       announceElapsed,
		reportEachStep: true,
		write:          writeObjectsReport,
	},
	{
		// --slots: one ring of unit Slots in admission mode, with
		// in-process instances of pkg/instance in slot mode (slots.go).
		mode:   "slots",
		chosen: func(p params) bool { return p.slots },
		configure: func(p *params, set func(string) bool) error {
			if !set("lease-duration") {
				p.leaseDuration = 15 * time.Second // the instance library's default
			}
			if !set("instances") {
				p.instances = 3
			}
			if p.instances < 2 || p.objects < 1 || p.slotCount < p.instances+1 || p.leaseDuration < 3*time.Second {
				return errors.New("--slots needs at least 2 --instances, 1 object, a --slot-count above --instances and a --lease-duration of at least 3s")
			}
			return nil
		},
		folder: "sharder-bench-slots-",
		prepare: func(p *params) {
			// The in-process instances log to instances.log beside the
			// sharder's log, once the run's folder exists (setUp): their
			// slot tables applied, acknowledgements and cache switches,
			// for a hand-over to be followed.
			ctrl.SetLogger(zap.New(zap.WriteTo(instanceLog), zap.UseDevMode(false)))
			// The sharder's default leader election timings (client-go's):
			// with localrun's short ones, a renewal slowed by a busy
			// machine ends the sharder (as a deployed one would with
			// them), and the run.
			p.leaderLease = 15 * time.Second
			p.revision = sourceRevision()
			p.apiServerFlags, p.etcdFlags = objectsAPIServerFlags, objectsEtcdFlags
		},
		setUp: func(_ context.Context, b *bench) (scenarioRun, error) {
			// The folder is made when the first process starts, after this.
			if err := os.MkdirAll(b.cl.LogDir, 0o750); err != nil {
				return scenarioRun{}, err
			}
			f, err := os.Create(filepath.Join(b.cl.LogDir, "instances.log"))
			if err != nil {
				return scenarioRun{}, err
			}
			instanceLog.set(f)
			s := &slotsRun{bench: b, rec: newSlotRecorder(), instances: map[string]*slotInstance{}, count: b.p.slotCount, occupied: make([]atomic.Int64, b.p.slotCount)}
			return scenarioRun{
				steps: []step{
					{"set-up", s.setUp},
					{"scale-out", s.scaleOut},
					{"instance stopped", s.stopOne},
					{"rolling restart", s.rollingRestart},
					{"sharder memory", s.memory},
				},
				report: s.report,
				release: func() {
					s.stopAll()
					instanceLog.set(nil)
					_ = f.Close()
				},
			}, nil
		},
		announce:       announceElapsed,
		reportEachStep: true,
		write:          writeSlotsReport,
	},
	{
		// The default: the floor, then the sharder's figures as ratios to
		// it, with simulated instances as processes (run.go, steps.go).
		chosen: func(params) bool { return true },
		folder: "sharder-bench-",
		setUp: func(ctx context.Context, b *bench) (scenarioRun, error) {
			if err := b.setUp(ctx); err != nil {
				return scenarioRun{}, err
			}
			return scenarioRun{
				steps: []step{
					{"initial assignment", b.initialAssignment},
					{"floor beside the idle sharder", b.idleFloor},
					{"assignment latency", b.latency},
					{"assignment latency in admission mode", b.admissionLatency},
					{"rebalance", b.rebalance},
					{"fail-over", b.failover},
					{"in-process variant", b.inProcess},
					{"memory", b.memory},
				},
				report: b.report,
			}, nil
		},
		announce: func(step string, _ time.Duration) { fmt.Printf("measuring %s ...\n", step) },
		// --step: the named steps only; the initial assignment always
		// runs, as it starts the instances and the sharder.
		skip: func(p params, step string) bool {
			return len(p.steps) > 0 && step != "initial assignment" && !slices.Contains(p.steps, step)
		},
		write: writeReport,
	},
}

// instanceLog is the slots mode's log of its in-process instances: set to
// instances.log in the run's folder once it exists.
var instanceLog = &lateWriter{}

// announceElapsed prints a step's name with the time the run has taken.
func announceElapsed(step string, elapsed time.Duration) {
	fmt.Printf("%s ... (%s)\n", step, elapsed.Round(time.Second))
}

// killFleet kills the holders of a fleet once started.
func killFleet(f *fleet) {
	if f != nil {
		f.killAll()
	}
}

// chooseScenario returns the scenario the flags choose, configured: its
// defaults applied to the flags left unset (set tells which were set). An
// error is a usage error: more than one mode, or flags the scenario cannot
// run with.
func chooseScenario(p *params, set func(name string) bool) (scenario, error) {
	var modes []string
	for _, s := range scenarios {
		if s.mode != "" && s.chosen(*p) {
			modes = append(modes, "--"+s.mode)
		}
	}
	if len(modes) > 1 {
		return scenario{}, fmt.Errorf("%s: one mode at a time", strings.Join(modes, ", "))
	}
	for _, s := range scenarios {
		if !s.chosen(*p) {
			continue
		}
		if s.configure != nil {
			if err := s.configure(p, set); err != nil {
				return scenario{}, err
			}
		}
		return s, nil
	}
	return scenario{}, errors.New("no scenario")
}

// runScenario runs scenario s with parameters p: on a new local control
// plane, the scenario's set-up, then each of its steps not skipped, then
// its report, printed and, with --output, written.
func runScenario(ctx context.Context, s scenario, p params) error {
	if s.prepare != nil {
		s.prepare(&p)
	}
	return onCluster(p, s.folder, func(b *bench) error {
		start := time.Now()
		r, err := s.setUp(ctx, b)
		if err != nil {
			return err
		}
		if r.release != nil {
			defer r.release()
		}
		write := func(report string) error {
			return s.write(b.p, report)
		}
		for _, st := range r.steps {
			if s.skip != nil && s.skip(b.p, st.name) {
				continue
			}
			s.announce(st.name, time.Since(start))
			if err := st.fn(ctx); err != nil {
				return fmt.Errorf("%s: %w", st.name, err)
			}
			if s.reportEachStep && p.output != "" {
				b.p.loadAfter = loadAverage()
				if err := write(r.report()); err != nil {
					return err
				}
			}
		}
		b.p.loadAfter = loadAverage()
		fmt.Printf("done in %s\n\n", time.Since(start).Round(time.Second))
		report := r.report()
		fmt.Print(report)
		if p.output != "" {
			if err := write(report); err != nil {
				return err
			}
			fmt.Printf("\nwritten to %s\n", p.output)
		}
		return nil
	})
}
