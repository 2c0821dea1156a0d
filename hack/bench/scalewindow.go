package main

import (
	"context"
	"os"
	"time"
)

// The scale mode's windows of CPU time: the sharder's, this process's and
// the machine's over one measurement.

// window is the start of a measurement of CPU times.
type window struct {
	s                  *scale
	start              time.Time
	sharder, self, all time.Duration
	requests           float64
}

// windowCPU is what a window measured.
type windowCPU struct {
	length, sharder, self, machine time.Duration
	// requests are the API requests the sharder sent.
	requests float64
}

func (w windowCPU) cores() float64 { return w.sharder.Seconds() / w.length.Seconds() }

func (w windowCPU) selfCores() float64 { return w.self.Seconds() / w.length.Seconds() }

func (w windowCPU) machineCores() float64 { return w.machine.Seconds() / w.length.Seconds() }

func (s *scale) startWindow(ctx context.Context) (*window, error) {
	w := &window{s: s}
	var err error
	if w.requests, err = sharderMetric(ctx, s.sharder.MetricsAddress, "rest_client_requests_total"); err != nil {
		return nil, err
	}
	if w.self, err = cpuTime(os.Getpid()); err != nil {
		return nil, err
	}
	w.all = machineCPU()
	w.start = time.Now()
	w.sharder, err = cpuTime(s.sharder.Pid())
	return w, err
}

func (w *window) end(ctx context.Context) (windowCPU, error) {
	if err := w.s.failure(); err != nil {
		return windowCPU{}, err
	}
	sharder, err := cpuTime(w.s.sharder.Pid())
	if err != nil {
		return windowCPU{}, err
	}
	d := windowCPU{length: time.Since(w.start), sharder: sharder - w.sharder, machine: machineCPU() - w.all}
	self, err := cpuTime(os.Getpid())
	if err != nil {
		return d, err
	}
	d.self = self - w.self
	requests, err := sharderMetric(ctx, w.s.sharder.MetricsAddress, "rest_client_requests_total")
	d.requests = requests - w.requests
	return d, err
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
