package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"

	"github.com/sharder-dev/sharder/internal/localrun"
)

// apiServer reads the control plane's own figures at the run's size: one
// metadata LIST of the ring's objects as the API server timed it, its
// watch cache, and the memory of kube-apiserver and etcd.
func (o *objectsRun) apiServer(ctx context.Context) error {
	before, err := o.apiServerMetrics(ctx)
	if err != nil {
		return err
	}
	mc, err := metadata.NewForConfig(o.cl.ControlPlane.Config)
	if err != nil {
		return err
	}
	t0 := time.Now()
	list, err := mc.Resource(configMaps).Namespace(objectNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing the ring's objects: %w", err)
	}
	took := time.Since(t0)
	after, err := o.apiServerMetrics(ctx)
	if err != nil {
		return err
	}
	const listDuration = "apiserver_request_duration_seconds"
	lbls := []string{`verb="LIST"`, `resource="configmaps"`}
	n := after.sum(listDuration+"_count", lbls...) - before.sum(listDuration+"_count", lbls...)
	served := after.sum(listDuration+"_sum", lbls...) - before.sum(listDuration+"_sum", lbls...)
	o.api = append(o.api,
		row{measure: "configmaps stored (the API server's count, apiserver_resource_objects)", value: fmt.Sprintf("%.0f",
			max(after.sum("apiserver_resource_objects", `resource="configmaps"`), after.sum("apiserver_storage_objects", `resource="configmaps"`)))},
		row{measure: fmt.Sprintf("one LIST of the ring's %d objects' metadata (consistent, from the watch cache): as the API server timed it (apiserver_request_duration_seconds, %.0f request)", len(list.Items), n),
			value: seconds(time.Duration(served * float64(time.Second)))},
		row{measure: "  the same LIST as this process waited for it (request to the last item decoded)", value: seconds(took)},
	)
	if c := after.sum("apiserver_watch_list_duration_seconds_count"); c > 0 {
		o.api = append(o.api, row{measure: "watch-list streams (the informers' first sync), all resources: count, mean duration (apiserver_watch_list_duration_seconds)",
			value: fmt.Sprintf("%.0f, %s", c, seconds(time.Duration(after.sum("apiserver_watch_list_duration_seconds_sum")/c*float64(time.Second))))})
	}
	for _, s := range after.matching("apiserver_watch_cache_", `resource="configmaps"`) {
		o.api = append(o.api, row{measure: "`" + s.name + "`", value: strconv.FormatFloat(s.value, 'f', -1, 64)})
	}
	procs := childProcesses()
	for _, name := range []string{"kube-apiserver", "etcd"} {
		pid, ok := procs[name]
		if !ok {
			return fmt.Errorf("no %s process of this run found", name)
		}
		m, err := localrun.ReadMemory(pid)
		if err != nil {
			return err
		}
		cpu, err := cpuTime(pid)
		if err != nil {
			return err
		}
		o.api = append(o.api, row{measure: name + ": RSS now, peak RSS (VmHWM), CPU over the whole run",
			value: fmt.Sprintf("%s, %s, %s", mib(m.RSS), mib(m.Peak), seconds(cpu))})
	}
	if size, err := o.etcdDBSize(ctx); err == nil {
		o.api = append(o.api, row{measure: "etcd database size (etcd_mvcc_db_total_size_in_bytes)", value: mib(uint64(size))})
	}
	o.api = append(o.api, row{measure: "sharder: RSS steady, peak RSS (VmHWM), live heap, after its restart",
		value: fmt.Sprintf("%s, %s, %s", mib(o.steadyRSS), mib(o.peakRSS), mib(uint64(o.heap)))})
	return nil
}

// apiServerLists returns the LIST requests the API server served so far.
func (o *objectsRun) apiServerLists(ctx context.Context) (float64, error) {
	m, err := o.apiServerMetrics(ctx)
	if err != nil {
		return 0, err
	}
	return m.sum("apiserver_request_total", `verb="LIST"`, `resource="configmaps"`), nil
}

func (o *objectsRun) apiServerMetrics(ctx context.Context) (metricSamples, error) {
	cs, err := kubernetes.NewForConfig(o.cl.ControlPlane.Config)
	if err != nil {
		return nil, err
	}
	body, err := cs.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the API server's metrics: %w", err)
	}
	return parseMetrics(body), nil
}

func (o *objectsRun) etcdDBSize(ctx context.Context) (float64, error) {
	etcd := o.cl.ControlPlane.Env.Environment.ControlPlane.Etcd
	if etcd == nil || etcd.URL == nil {
		return 0, fmt.Errorf("no etcd URL")
	}
	body, err := httpGet(ctx, etcd.URL.String()+"/metrics")
	if err != nil {
		return 0, err
	}
	return parseMetrics(body).sum("etcd_mvcc_db_total_size_in_bytes"), nil
}

// metricSample is one line of a Prometheus text exposition.
type metricSample struct {
	name, labels string
	value        float64
}

type metricSamples []metricSample

func parseMetrics(body []byte) metricSamples {
	var out metricSamples
	s := bufio.NewScanner(bytes.NewReader(body))
	s.Buffer(make([]byte, 64*1024), 4*1024*1024)
	for s.Scan() {
		line := s.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		var m metricSample
		var rest string
		if i := strings.IndexByte(line, '{'); i >= 0 {
			j := strings.LastIndexByte(line, '}')
			if j < i {
				continue
			}
			m.name, m.labels, rest = line[:i], line[i+1:j], line[j+1:]
		} else {
			m.name, rest, _ = strings.Cut(line, " ")
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			continue
		}
		m.value = v
		out = append(out, m)
	}
	return out
}

// sum adds the samples named name whose labels contain every one of labels.
func (ms metricSamples) sum(name string, labels ...string) float64 {
	var total float64
	for _, m := range ms {
		if m.name == name && hasLabels(m.labels, labels) {
			total += m.value
		}
	}
	return total
}

// matching returns the samples whose name starts with prefix, with labels,
// histograms as their count and sum only.
func (ms metricSamples) matching(prefix string, labels ...string) []metricSample {
	var out []metricSample
	for _, m := range ms {
		if !strings.HasPrefix(m.name, prefix) || strings.HasSuffix(m.name, "_bucket") || !hasLabels(m.labels, labels) {
			continue
		}
		out = append(out, metricSample{name: m.name + "{" + m.labels + "}", value: m.value})
	}
	return out
}

func hasLabels(have string, want []string) bool {
	for _, l := range want {
		if !strings.Contains(have, l) {
			return false
		}
	}
	return true
}

// childProcesses returns the processes this one started, by command name.
func childProcesses() map[string]int {
	out := map[string]int{}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return out
	}
	self := os.Getpid()
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		open, end := bytes.IndexByte(data, '('), bytes.LastIndexByte(data, ')')
		if open < 0 || end < open {
			continue
		}
		fields := strings.Fields(string(data[end+1:]))
		if len(fields) < 2 || fields[1] != strconv.Itoa(self) {
			continue
		}
		out[string(data[open+1:end])] = pid
	}
	return out
}

// focusedCPU returns the CPU time of the step's profile spent under the
// functions matching focus (a pprof regular expression).
func (o *objectsRun) focusedCPU(ctx context.Context, step, focus string) (time.Duration, error) {
	file := filepath.Join(o.cl.Dir, strings.ReplaceAll(step, " ", "-")+".pprof")
	out, err := exec.CommandContext(ctx, "go", "tool", "pprof", "-top", "-cum", "-nodecount=500", "-focus="+focus, o.cl.Binaries.Sharder, file).CombinedOutput() //nolint:gosec // the run's own files
	if err != nil {
		return 0, fmt.Errorf("go tool pprof: %w\n%s", err, out)
	}
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) == 6 && strings.HasSuffix(f[5], "ringAssigner).rebuild") {
			return time.ParseDuration(f[3])
		}
	}
	return 0, nil // no sample in the pass
}

// heapProfile records the sharder's heap profile and returns the top of
// its live memory.
func (o *objectsRun) heapProfile(ctx context.Context) (string, error) {
	body, err := httpGet(ctx, "http://"+o.pprofAddress+"/debug/pprof/heap?gc=1")
	if err != nil {
		return "", fmt.Errorf("reading the sharder's heap profile: %w", err)
	}
	file := filepath.Join(o.cl.Dir, "heap.pprof")
	if err := os.WriteFile(file, body, 0o600); err != nil {
		return "", err
	}
	out, err := exec.CommandContext(ctx, "go", "tool", "pprof", "-top", "-sample_index=inuse_space", "-nodecount=15", o.cl.Binaries.Sharder, file).CombinedOutput() //nolint:gosec // the run's own files
	if err != nil {
		return "", fmt.Errorf("go tool pprof: %w\n%s", err, out)
	}
	return string(out), nil
}
