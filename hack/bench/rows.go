package main

import (
	"fmt"
	"time"
)

// The rows of the default scenario's table, and the profiles of the steps
// that missed their targets.

// keepProfile waits for a step's CPU profile and keeps it when the step
// missed its target.
func (b *bench) keepProfile(step string, p *cpuProfile, ok bool) error {
	top, err := p.wait()
	if err != nil {
		return err
	}
	if !ok {
		b.profiles = append(b.profiles, profile{step: step, top: top})
	}
	return nil
}

// addRatio adds a figure measured against the floor: took against the time
// of patches at the floor rate with no sharder running, target ≤ limit ×.
// It reports whether the target was met.
func (b *bench) addRatio(measure string, took time.Duration, patches int, limit float64, note string) bool {
	f := b.stopped
	switch {
	case b.stepFloor.patches > 0:
		f = b.stepFloor
	case b.ringFloor.patches > 0:
		f = b.ringFloor
	}
	return b.addRatioTo(measure, took, patches, limit, note, f)
}

func (b *bench) addRatioTo(measure string, took time.Duration, patches int, limit float64, note string, f floor) bool {
	floorTime := f.timeFor(patches)
	ratio := took.Seconds() / floorTime.Seconds()
	value := fmt.Sprintf("%s = **%.2f × floor**", seconds(took), ratio)
	if note != "" {
		value += " " + note
	}
	ok := ratio <= limit
	b.add(measure, value, fmt.Sprintf("%d patches at %.0f/s: %s", patches, f.rate(), seconds(floorTime)),
		fmt.Sprintf("≤ %.2f × floor", limit), ok)
	return ok
}

// addCPU adds the sharder's CPU time per label write of a step.
func (b *bench) addCPU(step string, cpu time.Duration, writes float64) {
	if writes <= 0 {
		return
	}
	b.add(fmt.Sprintf("sharder CPU per label write, %s (user+sys / PATCH requests sent)", step),
		fmt.Sprintf("%.0f µs (%s over %.0f writes)", float64(cpu.Microseconds())/writes, seconds(cpu), writes), "", "", true)
}

// addMachineCPU adds the whole machine's busy CPU time per floor patch of
// a step, beside the same figure of its floor: on a machine whose cores
// the API server saturates, the step cannot beat the floor by more than
// the ratio of the two, whatever the sharder does while it waits.
func (b *bench) addMachineCPU(step string, machine time.Duration, patches int, sharder time.Duration, f floor) {
	if machine <= 0 || patches <= 0 || f.machineCPU <= 0 {
		return
	}
	per := machine / time.Duration(patches)
	b.add(fmt.Sprintf("machine CPU per floor patch, %s (every process, user+sys)", step),
		fmt.Sprintf("%.0f µs, %.2f × the floor's %.0f µs; the sharder's own share %.0f µs",
			float64(per.Microseconds()), per.Seconds()/f.machinePerPatch().Seconds(), float64(f.machinePerPatch().Microseconds()),
			float64(sharder.Microseconds())/float64(patches)), "", "", true)
}

func (b *bench) add(measure, value, floorTime, target string, ok bool) {
	verdict := "ok"
	if target == "" {
		verdict = ""
	} else if !ok {
		verdict = "missed"
	}
	b.rows = append(b.rows, row{measure, value, floorTime, target, verdict})
	fmt.Printf("  %s: %s\n", measure, value)
}
