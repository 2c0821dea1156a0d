package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/sharder-dev/sharder/internal/localrun"
)

// profile is where the sharder spent its CPU during one step.
type profile struct {
	step string
	top  string
}

// cpuProfile records a CPU profile of the sharder process for d once its
// pprof endpoint answers. Wait returns the `go tool pprof -top` lines.
type cpuProfile struct {
	done chan struct{}
	top  string
	err  error
}

func (b *bench) startCPUProfile(ctx context.Context, step string, d time.Duration) *cpuProfile {
	p := &cpuProfile{done: make(chan struct{})}
	addr, binary := b.pprofAddress, b.cl.Binaries.Sharder
	file := filepath.Join(b.cl.Dir, strings.ReplaceAll(step, " ", "-")+".pprof")
	go func() {
		defer close(p.done)
		p.top, p.err = recordCPUProfile(ctx, addr, binary, file, d)
	}()
	return p
}

// wait returns the profile once recorded.
func (p *cpuProfile) wait() (string, error) {
	<-p.done
	return p.top, p.err
}

func recordCPUProfile(ctx context.Context, addr, binary, file string, d time.Duration) (string, error) {
	url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, max(int(d.Seconds()), 1))
	var body []byte
	err := localrun.Poll(ctx, 30*time.Second, 20*time.Millisecond, func() error {
		var err error
		body, err = httpGet(ctx, url)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("recording a CPU profile of the sharder: %w", err)
	}
	if err := os.WriteFile(file, body, 0o600); err != nil {
		return "", err
	}
	out, err := exec.CommandContext(ctx, "go", "tool", "pprof", "-top", "-nodecount=15", binary, file).CombinedOutput() //nolint:gosec // the run's own files
	if err != nil {
		return "", fmt.Errorf("go tool pprof: %w\n%s", err, out)
	}
	return string(out), nil
}

func httpGet(ctx context.Context, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return body, nil
}

// sharderMetric sums the samples of metric on the sharder's metrics
// endpoint whose labels contain every one of labels (e.g. `method="PATCH"`).
func sharderMetric(ctx context.Context, addr, metric string, labels ...string) (float64, error) {
	body, err := httpGet(ctx, "http://"+addr+"/metrics")
	if err != nil {
		return 0, fmt.Errorf("reading the sharder's metrics: %w", err)
	}
	var sum float64
	found := false
	s := bufio.NewScanner(strings.NewReader(string(body)))
	s.Buffer(make([]byte, 64*1024), 1024*1024)
	for s.Scan() {
		line := s.Text()
		name, rest, _ := strings.Cut(line, " ")
		base, lbls, _ := strings.Cut(name, "{")
		if base != metric {
			continue
		}
		if i := strings.LastIndexByte(line, '}'); i >= 0 {
			lbls, rest = line[len(base)+1:i], strings.TrimSpace(line[i+1:])
		}
		matches := true
		for _, l := range labels {
			if !strings.Contains(lbls, l) {
				matches = false
			}
		}
		if !matches {
			continue
		}
		v, err := strconv.ParseFloat(strings.Fields(rest)[0], 64)
		if err != nil {
			return 0, fmt.Errorf("parsing %q: %w", line, err)
		}
		sum += v
		found = true
	}
	if !found {
		return 0, fmt.Errorf("%s%v missing from the sharder's metrics", metric, labels)
	}
	return sum, s.Err()
}

// patchesSent returns the PATCH requests the sharder process sent so far.
func (b *bench) patchesSent(ctx context.Context) (float64, error) {
	return sharderMetric(ctx, b.sharder.MetricsAddress, "rest_client_requests_total", `method="PATCH"`)
}

// liveHeap returns the sharder's heap in use right after a garbage
// collection, from its heap profile (which collects first with gc=1).
func (b *bench) liveHeap(ctx context.Context) (float64, error) {
	body, err := httpGet(ctx, "http://"+b.pprofAddress+"/debug/pprof/heap?gc=1&debug=1")
	if err != nil {
		return 0, fmt.Errorf("reading the sharder's heap profile: %w", err)
	}
	for line := range strings.Lines(string(body)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "# HeapAlloc = "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, errors.New("HeapAlloc missing from the sharder's heap profile")
}
