package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// Settling: the work a step sets off (the instances' reads of objects that
// left their caches, the API server's watch deliveries, garbage
// collection) goes on for a while after the step's last write. Measuring
// the next figure meanwhile would charge that work to it, so the bench
// waits for the machine to be quiet first.
const (
	settleWindow  = 250 * time.Millisecond
	settleQuiet   = 0.3 // cores busy, at most, for a window to count as quiet
	settleWindows = 2   // quiet windows in a row
	settleTimeout = 15 * time.Second
)

// settle waits until the machine's CPUs have been quiet for settleWindows
// windows in a row, or settleTimeout has passed (a machine busy with other
// work never settles: the run goes on and says so).
func (b *bench) settle(ctx context.Context) error {
	deadline := time.Now().Add(settleTimeout)
	quiet := 0
	prevBusy, prevTotal, err := cpuTicks()
	if err != nil { // not Linux: nothing to wait on
		fmt.Printf("  (cannot tell whether the machine is quiet: %v)\n", err)
		return nil
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(settleWindow):
		}
		busy, total, err := cpuTicks()
		if err != nil {
			return err
		}
		cores := 0.0
		if total > prevTotal {
			cores = float64(busy-prevBusy) / float64(total-prevTotal) * float64(runtime.NumCPU())
		}
		prevBusy, prevTotal = busy, total
		if cores <= settleQuiet {
			if quiet++; quiet >= settleWindows {
				return nil
			}
			continue
		}
		quiet = 0
		if time.Now().After(deadline) {
			fmt.Printf("  (the machine did not settle within %s: %.1f cores busy)\n", settleTimeout, cores)
			return nil
		}
	}
}

// cpuTicks returns the busy and total CPU time of the machine so far, in
// clock ticks, from /proc/stat.
func cpuTicks() (busy, total uint64, err error) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	line, _, _ := strings.Cut(string(data), "\n")
	fields := strings.Fields(line)
	if len(fields) < 5 || fields[0] != "cpu" {
		return 0, 0, fmt.Errorf("unexpected /proc/stat: %q", line)
	}
	for i, f := range fields[1:] {
		v, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("parsing /proc/stat: %w", err)
		}
		if i >= 8 { // guest times are counted in user and nice already
			break
		}
		total += v
		if i != 3 && i != 4 { // idle, iowait
			busy += v
		}
	}
	return busy, total, nil
}

// clockTick is the unit of /proc/stat's times (USER_HZ, 100 on Linux).
const clockTick = 10 * time.Millisecond

// machineCPU returns the busy CPU time of the whole machine so far, zero
// when unknown.
func machineCPU() time.Duration {
	busy, _, err := cpuTicks()
	if err != nil {
		return 0
	}
	return time.Duration(busy) * clockTick //nolint:gosec // clock ticks since boot fit an int64 for millions of years
}
