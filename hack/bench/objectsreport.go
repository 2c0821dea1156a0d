package main

import (
	"cmp"
	"fmt"
	"os"
	"strings"

	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// report renders the objects mode's results, the control plane's figures
// and the sharder's profiles as Markdown.
func (o *objectsRun) report() string {
	var out strings.Builder
	out.WriteString(table(o.rows, false))
	out.WriteString("\n### The API server's side\n\n" +
		"The control plane's own figures at the end of the run, beside the sharder's: which part needs the bigger machine.\n\n" +
		"| measurement | result |\n| --- | --- |\n")
	for _, r := range o.api {
		fmt.Fprintf(&out, "| %s | %s |\n", r.measure, r.value)
	}
	if o.heapTop != "" {
		fmt.Fprintf(&out, "\n### Where the sharder's memory goes\n\n`go tool pprof -top -sample_index=inuse_space` of the restarted sharder's heap profile, every object cached:\n\n```\n%s```\n", o.heapTop)
	}
	for _, p := range o.profiles {
		fmt.Fprintf(&out, "\n### Where the sharder's time went during the %s\n\n"+
			"`go tool pprof -top` of the sharder process; a profile's total samples, as a share of its duration, is how much of one core the sharder used:\n\n```\n%s```\n", p.step, p.top)
	}
	return out.String()
}

// writeObjectsReport writes the objects mode's report with the machine and
// the method to p.output.
func writeObjectsReport(p params, report string) error {
	var s strings.Builder
	fmt.Fprintf(&s, `# Benchmarks with many objects

Figures of the sharder with %d objects in one ring of %d instances, against
a local control plane (etcd and kube-apiserver on the same machine),
produced by `+"`make bench-objects`"+` (`+"`go run ./hack/bench --many-objects --objects %d --watched-objects %d --create-workers %d%s --output docs/benchmarks-objects.md`"+`),
which rewrites this file. It runs by hand, not in `+"`make test`"+`.

## Results

`, p.objects, p.instances, p.objects, p.watchedObjects, p.workers, algorithmFlag(p.algorithm))
	s.WriteString(report)
	fmt.Fprintf(&s, `
## Machine

%[1]s| sharder built from | %[2]s |

The control plane, the sharder and the benchmark process (which holds every
instance's Lease, watches every object and creates them) share these CPUs.

## Method

- One ring over ConfigMaps without data in one namespace labelled %[3]s=true,
  algorithm %[4]s with %[5]d virtual nodes per instance. The sharder runs as one
  replica with leader election (client-go's default timings), its webhook,
  metrics and profiling endpoint on, and its default settings%[6]s (so its
  garbage collector's target is 50, and no soft memory limit is set).
- The control plane runs with etcd's quota raised to 8 GiB and the API
  server's requests in flight to 1,000 (500 mutating); every client here
  authenticates as a member of system:masters, which API Priority and
  Fairness exempts.
- **The instances** are %[7]d leaseholder.Holders in the benchmark process
  (lease duration %[8]s), as in `+"`make bench-scale`"+`; one metadata watch of the
  ring's objects answers their drains at once and records when each label
  changed.
- **Objects**: before any sharder runs, this process creates the ring's
  ConfigMaps by %[13]d parallel requests over protobuf: first all but
  %[11]d + %[12]d of them with the shard label the assigning webhook gives
  (the ring of the instances, looked up here, as a ring in admission mode
  labels objects at creation), then %[11]d without a label.
- **Starts**: from starting the sharder process to its log line that the
  ring's caches synced, and to its first decision: the first object
  without a label labelled, as the watch delivers it. The first start
  assigns the %[11]d objects without a label (a write each). Then VmHWM
  (peak RSS, the start-up included) and VmRSS once RSS stopped growing,
  from /proc/<pid>/status, and the live heap: HeapAlloc right after a
  garbage collection (heap profile with gc=1), divided by the objects
  cached (so it includes the sharder's fixed heap).
- **Admission mode**: the ring's spec.assignment.mode is then set to
  Admission, and %[12]d objects are created through the sharder's assigning
  webhook, whose answer carries the label. A million creations through the
  webhook would take hours on this machine; its cost per admission is the
  figure above.
- **Restart**: the sharder is stopped gracefully, the shard label of %[14]d
  objects is removed meanwhile (as the sharder, whose writes the
  validating webhook lets through), and a new sharder process starts on
  every object, measured as the first start.
- **Scale-out**: one more instance's holder starts. The decisions' CPU is
  the samples of the sharder's CPU profile (%[9]s from a second before the new
  Lease is due) in the pass that decides from the caches which objects
  move (the focus %[10]s), no LIST meaning none in the API server's
  apiserver_request_total for configmaps meanwhile. The whole move is
  timed until every object is on its instance, none draining; every
  object's place is then checked against the ring.
- **The API server's side**: one metadata LIST of the ring's namespace from
  this process, timed by the API server (its apiserver_request_duration_seconds)
  and by this process; the API server's watch cache metrics for configmaps;
  RSS and CPU of kube-apiserver and etcd from /proc.
`, machine(p), p.revision, "`"+benchLabel+"`", "`"+cmp.Or(p.algorithm, sharderv1alpha1.DefaultAlgorithm)+"`", sharderv1alpha1.DefaultVirtualNodes,
		extraArgs(append(append([]string(nil), p.sharderEnv...), p.sharderArgs...)),
		p.instances, p.leaseDuration, p.profileDuration, "`"+decisionFocus+"`", p.watchedObjects, p.admittedObjects, p.workers, unassignedAtRestart)
	return os.WriteFile(p.output, []byte(s.String()), 0o644) //nolint:gosec // a document of the repository, meant to be read
}
