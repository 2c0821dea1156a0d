package main

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"

	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// table renders the results as a Markdown table.
func (b *bench) table() string {
	var s strings.Builder
	s.WriteString("| measurement | result | target | |\n| --- | --- | --- | --- |\n")
	for _, r := range b.rows {
		fmt.Fprintf(&s, "| %s | %s | %s | %s |\n", r.measure, r.value, r.target, r.verdict)
	}
	return s.String()
}

// writeReport writes the table with the machine and the method to path.
func writeReport(p params, table string) error {
	var s strings.Builder
	s.WriteString(`# Benchmarks

Figures of the sharder running as a process against a local control plane
(etcd and kube-apiserver on the same machine), produced by ` + "`make bench`" + `
(` + "`go run ./hack/bench --output docs/benchmarks.md`" + `), which rewrites this file.

## Results

`)
	s.WriteString(table)
	fmt.Fprintf(&s, `
## Machine

| | |
| --- | --- |
| date | %s |
| uname | %s |
| CPU | %s |
| CPU count | %d |
| Go | %s |
| load average at the start (1, 5, 15 min) | %s |
| control plane | kube-apiserver and etcd on the same machine, no kubelet |

The control plane, the sharder, the simulated instances and the load generator
share these CPUs, so the figures include their contention, and whatever else
the machine ran at the time (see the load average).

## Method

- One ring over ConfigMaps in one namespace, consistent hashing with %d virtual
  nodes per instance. The sharder runs as one replica with leader election,
  its webhook and metrics on, and its default settings%s; it authenticates
  as its own user.
- Simulated instances are processes of `+"`hack/bench`"+` built on the instance
  library (pkg/instance): each holds its Lease (duration %s) and acknowledges
  drains as soon as it sees them; they reconcile nothing else.
- Times come from a watch on the objects' metadata in the benchmark process:
  an object counts as assigned when the watch delivers its shard label, as an
  instance would see it.
- **Pre-existing objects**: %d ConfigMaps exist and three instances hold their
  Leases before the sharder starts; measured from starting the sharder process
  (so including its start-up, leader election and cache sync) to the last
  object labelled on its final instance.
- **Latency**: %d ConfigMaps created at %d/s, each measured from sending its
  create request to its shard label arriving on the watch.
- **Rebalance**: a fourth instance starts; measured from its Lease's
  acquireTime to the last object arriving on its final instance (drain request, then the
  acknowledgement that hands it over). The moved fraction compares the assignment before and after.
- **Fail-over**: one of the four instances is killed with SIGKILL; measured from
  its Lease's last renewTime to the last of its objects relabelled. The lease
  protocol waits 2 × lease duration before it takes the Lease (expired, then
  uncertain) and then moves the objects at once.
- **Memory**: VmRSS and VmHWM of the sharder from /proc/<pid>/status once RSS has
  stopped growing, with %d objects and after creating objects up to %d. Per
  object: RSS difference divided by the objects added. CPU: user+system time
  from /proc/<pid>/stat over 10 s with nothing changing.
`, time.Now().UTC().Format(time.RFC3339), uname(), cpuModel(), runtime.NumCPU(), runtime.Version(), p.loadBefore,
		sharderv1alpha1.DefaultVirtualNodes, extraArgs(append(append([]string(nil), p.sharderEnv...), p.sharderArgs...)), p.leaseDuration, p.objects, p.rateObjects, p.rate, p.objects, p.largeObjects)
	return os.WriteFile(p.output, []byte(s.String()), 0o644) //nolint:gosec // a document of the repository, meant to be read
}

func uname() string {
	out, err := exec.CommandContext(context.Background(), "uname", "-srmo").Output()
	if err != nil {
		return runtime.GOOS + "/" + runtime.GOARCH
	}
	return strings.TrimSpace(string(out))
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if k, v, ok := strings.Cut(s.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat;
// 100 on every Linux architecture Go supports.
const clockTicks = 100

// cpuTime returns the user plus system CPU time of pid.
func cpuTime(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command name (which may hold spaces) start at ")".
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return 0, fmt.Errorf("unexpected /proc/%d/stat", pid)
	}
	fields := strings.Fields(string(data[i+1:]))
	if len(fields) < 13 {
		return 0, fmt.Errorf("unexpected /proc/%d/stat", pid)
	}
	// utime and stime are fields 14 and 15 of stat; here 12 and 13 (0-based
	// after the state field at index 0).
	utime, err1 := strconv.ParseUint(fields[11], 10, 64)
	stime, err2 := strconv.ParseUint(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("parsing /proc/%d/stat", pid)
	}
	ticks := utime + stime
	if ticks > math.MaxInt64/uint64(time.Second) {
		return 0, fmt.Errorf("CPU time of %d out of range", pid)
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

func extraArgs(args []string) string {
	if len(args) == 0 {
		return ""
	}
	return " except `" + strings.Join(args, " ") + "`"
}

func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], ", ")
}
