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

// report renders the results, the floors and the profiles as Markdown.
func (b *bench) report() string {
	var s strings.Builder
	s.WriteString(table(b.rows, true))
	s.WriteString("\n### The floor\n\n" +
		"Label patches per second this API server accepted in this run, from the benchmark process with " +
		fmt.Sprintf("%d concurrent writers", b.p.floorWorkers) + " (the sharder's assignment workers). " +
		"The initial assignment's ratio is to the line of the ring's shard label set on the ring's objects (the sharder's own writes, reaching the same watches); " +
		"the rebalance's and the fail-over's are to the line measured just before each, with the sharder running " +
		"(the ring's shard label set on the objects outside the ring: the same watches again); the in-process variant's is to the floor measured just before it. " +
		"Every writer here and the sharder authenticate as members of system:masters, so API Priority and Fairness exempts them alike.\n\n")
	s.WriteString("| when | patches | rate | machine CPU per patch (every process) | sharder CPU meanwhile |\n| --- | --- | --- | --- | --- |\n")
	for _, f := range b.floors {
		cpu := "no sharder running"
		if f.sharderCPU > 0 {
			cpu = fmt.Sprintf("%s (%.0f µs per unrelated write)", seconds(f.sharderCPU), float64(f.sharderCPU.Microseconds())/float64(f.patches))
		}
		fmt.Fprintf(&s, "| %s | %d in %s | %.0f/s | %.0f µs | %s |\n", f.name, f.patches, seconds(f.took), f.rate(), float64(f.machinePerPatch().Microseconds()), cpu)
	}
	if b.stopped.patches > 0 && b.idle.patches > 0 {
		lo, hi := b.stopped.rate(), b.stopped.rate()
		for _, f := range b.floors {
			if f.sharderCPU == 0 && !strings.Contains(f.name, "shard label") { // the floors outside the ring without a sharder
				lo, hi = min(lo, f.rate()), max(hi, f.rate())
			}
		}
		within := "outside"
		if b.idle.rate() >= lo*0.98 && b.idle.rate() <= hi*1.02 {
			within = "within"
		}
		fmt.Fprintf(&s, "\nBeside the idle sharder the floor was %.0f/s, %+.1f %% from the first floor without it, and %s the range of the floors "+
			"without a sharder in this run (%.0f–%.0f/s, widened by 2 %% for this comparison). That difference is all that watching only the ring's namespaces "+
			"could win back on writes elsewhere: the sharder's metadata watches are cluster-wide, so each of these unrelated writes "+
			"is sent to it and decoded there (its CPU above), after the API server stored it.\n",
			b.idle.rate(), (b.idle.rate()/b.stopped.rate()-1)*100, within, lo, hi)
	}
	if len(b.profiles) > 0 {
		s.WriteString("\n### Where the sharder's time went where a target was missed\n\n" +
			"A profile's total samples, as a share of its duration, is how much of one core the sharder used; " +
			"for the rest of the step it waited for the API server's answers and watch events.\n")
		for _, p := range b.profiles {
			fmt.Fprintf(&s, "\n`go tool pprof -top` of the sharder process during the %s:\n\n```\n%s```\n", p.step, p.top)
		}
	}
	return s.String()
}

// table renders rows as a Markdown table, with their floor times or
// without.
func table(rows []row, floors bool) string {
	var s strings.Builder
	if floors {
		s.WriteString("| measurement | result | floor time | target | |\n| --- | --- | --- | --- | --- |\n")
	} else {
		s.WriteString("| measurement | result | target | |\n| --- | --- | --- | --- |\n")
	}
	for _, r := range rows {
		if floors {
			fmt.Fprintf(&s, "| %s | %s | %s | %s | %s |\n", r.measure, r.value, r.floor, r.target, r.verdict)
		} else {
			fmt.Fprintf(&s, "| %s | %s | %s | %s |\n", r.measure, r.value, r.target, r.verdict)
		}
	}
	return s.String()
}

// writeReport writes the report with the machine and the method to path.
func writeReport(p params, report string) error {
	var s strings.Builder
	s.WriteString(`# Benchmarks

Figures of the sharder against a local control plane (etcd and
kube-apiserver on the same machine), produced by ` + "`make bench`" + `
(` + "`go run ./hack/bench --output docs/benchmarks.md`" + `), which rewrites this file.
Every time is compared with the floor: how long the API server itself takes
for the label patches the operation needs, measured in the same run with the
same processes running.
One ring of 1,000 instances (` + "`" + `make bench-scale` + "`" + `) has its own page: [benchmarks-scale.md](benchmarks-scale.md);
so has one ring of a million objects (` + "`" + `make bench-objects` + "`" + `): [benchmarks-objects.md](benchmarks-objects.md).

## Results

`)
	s.WriteString(report)
	fmt.Fprintf(&s, `
## Machine

%s
The control plane, the sharder, the simulated instances and the load generator
share these CPUs, so the figures include their contention, and whatever else
the machine ran at the time (see the load average). The floor is measured in
the same run for that reason: the ratios are what to compare between machines.

## Method

- One ring over ConfigMaps in the namespaces labelled %s=true, consistent
  hashing with %d virtual nodes per instance. The sharder runs as one replica
  with leader election, its webhook, metrics and profiling endpoint on, and its
  default settings%s; it authenticates as its own user.
- Simulated instances are processes of `+"`hack/bench`"+` built on the instance
  library (pkg/instance): each holds its Lease (duration %s) and acknowledges
  drains as soon as it sees them, handing the object over to the instance the
  drain names; they reconcile nothing else.
- Times come from a watch on the objects' metadata in the benchmark process:
  an object counts as assigned when the watch delivers its shard label, as an
  instance would see it.
- **Floor**: %d JSON merge patches of one label of distinct ConfigMaps, sent
  through the metadata client by %d writers (the sharder's assignment
  workers), each patch changing the label's value. Measured with the
  instances running and no sharder, first on a namespace outside the ring
  (patches no instance's watch selects), then as the sharder's own writes:
  the ring's shard label set on the ring's objects (spread over the
  instances), and removed again. Those reach the same watches as the
  sharder's writes (the instance's, the benchmark's), so the API server
  sends each to two watches rather than one. The floor outside the ring is
  measured again with the sharder running idle: the difference is what the
  sharder's cluster-wide metadata watches cost writes it does not care
  about. Just before the rebalance and the fail-over, with the sharder
  running, the ring's shard label is set on the objects outside the ring
  (and removed): writes that reach the same watches again, the sharder's
  included, measured right before the step because the API server's rate
  on a busy machine moves by a factor of two within minutes. A figure's
  floor time is the time of the writes it needs at the rate of its floor
  (the initial assignment: the shard label set on the ring's objects; the
  rebalance and fail-over: the floor just before them): one patch per
  assigned object, two per moved object (the drain request and the
  acknowledgement that hands the object over), one per object of a dead
  instance.
- **Pre-existing objects**: %d ConfigMaps exist and three instances hold their
  Leases before the sharder starts; measured from starting the sharder process
  (so including its start-up, leader election and cache sync) to the last
  object labelled.
- **CPU per label write**: user+system time of the sharder process
  (/proc/<pid>/stat) over the step, divided by the PATCH requests it sent
  (its rest_client_requests_total).
- **Latency**: %d ConfigMaps created at %d/s, each measured from sending its
  create request to its shard label arriving on the watch; then the same with
  the ring's spec.assignment.mode set to Admission, where the create response
  itself should carry the label.
- **Rebalance**: a fourth instance starts; measured from its Lease's
  acquireTime to the last object arriving on its final instance. The moved
  fraction compares the assignment before and after.
- **Fail-over**: one of the four instances is killed with SIGKILL. Detection is
  measured from its Lease's last renewTime to the first of its objects
  relabelled: the lease protocol waits 2 × lease duration (expired, then
  uncertain). The relabelling is measured from the first to the last of its
  objects relabelled.
- **In-process variant**: the sharder process is stopped, the floor measured
  again, a second namespace with %d unassigned ConfigMaps joins the ring, and
  the sharder runs inside the benchmark process (the same `+"`sharder run`"+`
  command line) until they are assigned.
- **Memory**: objects are created up to %d with no sharder running; then the
  sharder process starts on them. VmHWM (peak RSS, including the caches' first
  sync) and VmRSS from /proc/<pid>/status once RSS stopped growing. Live heap:
  HeapAlloc right after a garbage collection (the heap profile with gc=1), at
  %d and at %d cached objects; per object is the difference divided by the
  objects added. Idle CPU: user+system time over 10 s with nothing changing.
- Where a target is missed, the report shows the top of a CPU profile of the
  sharder (%s from the start of the step) from its /debug/pprof/ endpoint.
`, machine(p),
		"`"+benchLabel+"`", sharderv1alpha1.DefaultVirtualNodes, extraArgs(append(append([]string(nil), p.sharderEnv...), p.sharderArgs...)), p.leaseDuration,
		p.floorPatches, p.floorWorkers, p.objects, p.rateObjects, p.rate, p.objects, p.largeObjects, 2*p.objects, p.largeObjects, p.profileDuration)
	return os.WriteFile(p.output, []byte(s.String()), 0o644) //nolint:gosec // a document of the repository, meant to be read
}

// machine renders the machine and the load of the run as a Markdown table.
func machine(p params) string {
	return fmt.Sprintf(`| | |
| --- | --- |
| date | %s |
| uname | %s |
| CPU | %s |
| CPU count | %d |
| memory | %s |
| Go | %s |
| load average at the start (1, 5, 15 min) | %s |
| load average at the end (1, 5, 15 min) | %s |
| control plane | kube-apiserver and etcd on the same machine, no kubelet |
`, time.Now().UTC().Format(time.RFC3339), uname(), cpuModel(), runtime.NumCPU(), memTotal(), runtime.Version(), p.loadBefore, p.loadAfter)
}

// memTotal returns the machine's memory from /proc/meminfo.
func memTotal() string {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return "unknown"
	}
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			kib, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return "unknown"
			}
			return fmt.Sprintf("%.1f GiB", float64(kib)/(1<<20))
		}
	}
	return "unknown"
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
