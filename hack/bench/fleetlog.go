package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
)

// fleetLog is the fleet's log file in the run's log folder: what the
// holders say (a renewal that failed, a Lease lost, and why) and, every
// few seconds, a summary of the fleet's API requests (count, latency,
// status codes), so that a run whose holders lost their Leases shows what
// their requests got back.
type fleetLog struct {
	mu  sync.Mutex
	out io.WriteCloser
	// requests are the fleet's requests since the last summary.
	requests []fleetRequest
}

// fleetRequest is one API request of the fleet.
type fleetRequest struct {
	verb    string
	latency time.Duration
	// code is the HTTP status, 0 for a request that got no answer.
	code int
}

func newFleetLog(path string) (*fleetLog, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, err
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	return &fleetLog{out: f}, nil
}

// logger returns a logger writing to the file, with the time of each line.
func (l *fleetLog) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		l.line(prefix + " " + args)
	}, funcr.Options{Verbosity: 1})
}

func (l *fleetLog) line(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = fmt.Fprintf(l.out, "%s %s\n", time.Now().UTC().Format("15:04:05.000"), s)
}

// wrap returns a transport that records each request's latency and status.
func (l *fleetLog) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
		start := time.Now()
		resp, err := rt.RoundTrip(req)
		r := fleetRequest{verb: req.Method, latency: time.Since(start)}
		if err == nil {
			r.code = resp.StatusCode
		}
		l.mu.Lock()
		l.requests = append(l.requests, r)
		l.mu.Unlock()
		return resp, err
	})
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// summarize writes a summary of the requests every period until ctx ends.
func (l *fleetLog) summarize(ctx context.Context, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		l.mu.Lock()
		reqs := l.requests
		l.requests = nil
		l.mu.Unlock()
		if len(reqs) == 0 {
			continue
		}
		l.line(summary(reqs))
	}
}

// summary describes requests: how many per verb, their latency's
// percentiles and their status codes.
func summary(reqs []fleetRequest) string {
	lat := make([]time.Duration, len(reqs))
	verbs, codes := map[string]int{}, map[int]int{}
	for i, r := range reqs {
		lat[i] = r.latency
		verbs[r.verb]++
		codes[r.code]++
	}
	slices.Sort(lat)
	q := func(p float64) time.Duration {
		return lat[min(len(lat)-1, int(p*float64(len(lat))))].Round(time.Millisecond)
	}
	return fmt.Sprintf("requests %d %v: latency p50 %v p90 %v p99 %v max %v; codes %v",
		len(reqs), verbs, q(0.5), q(0.9), q(0.99), lat[len(lat)-1].Round(time.Millisecond), codes)
}

func (l *fleetLog) Close() error { return l.out.Close() }
