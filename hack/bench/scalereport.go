package main

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"

	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// report renders the scale mode's results and the profiles of the steps
// that missed a target as Markdown.
func (s *scale) report() string {
	var out strings.Builder
	out.WriteString(table(s.rows, false))
	if len(s.profiles) > 0 {
		out.WriteString("\n### Where the sharder's time went where a target was missed\n\n" +
			"A profile's total samples, as a share of its duration, is how much of one core the sharder used.\n")
		for _, p := range s.profiles {
			fmt.Fprintf(&out, "\n`go tool pprof -top` of the sharder process during the step \"%s\":\n\n```\n%s```\n", p.step, p.top)
		}
	}
	return out.String()
}

// writeScaleReport writes the scale mode's report with the machine and the
// method to p.output.
func writeScaleReport(p params, report string) error {
	var s strings.Builder
	fmt.Fprintf(&s, `# Benchmarks at scale

Figures of the sharder with %d instances in one ring, against a local
control plane (etcd and kube-apiserver on the same machine), produced by
`+"`make bench-scale`"+` (`+"`go run ./hack/bench --scale --instances %d%s --output docs/benchmarks-scale.md`"+`),
which rewrites this file. It runs by hand, not in `+"`make test`"+`.

## Results

`, p.instances, p.instances, algorithmFlag(p.algorithm))
	s.WriteString(report)
	fmt.Fprintf(&s, `
## Machine

%s| sharder built from | %s |

The control plane, the sharder and the benchmark process (which holds every
instance's Lease) share these CPUs. The sharder's figures are its own CPU
time, so they move less with the machine's load than times do.

## Method

- One ring over ConfigMaps in the namespaces labelled %s=true, algorithm
  %s with %d virtual nodes per instance, %d ConfigMaps. The sharder runs
  as one replica with leader election, its webhook, metrics and profiling
  endpoint on, and its default settings%s.
- **The instances** are %d leaseholder.Holders (pkg/instance/leaseholder) in
  the benchmark process, started once the objects exist, over one renew
  period so that their renewals spread as those of instances started at
  different times do: lease duration %s, renewed every third of it,
  released for good on a graceful stop. They write through one client
  (protobuf) and do not watch their own Leases. What they log, and each
  second the count, latency and status codes of their requests, goes to
  fleet.log in the run's logs (kept with `+"`SCALE_ARGS=--keep`"+`).
  One metadata watch on the ring's objects answers the drains of all of
  them as pkg/instance does for one: an object whose drain label is set and
  whose shard label names a running instance is handed over at once with
  drain.Acknowledge (read again on a conflict).
- **Times** come from that watch: a move starts when the watch delivers the
  drain label on one of the instance's objects, or its shard label changed,
  and an object arrives when its shard label names its new instance. An
  added instance's change is its Lease's acquireTime; a graceful stop's, its
  release's renewTime; a killed instance's, two lease durations after its
  last renewTime, when the sharder may take its Lease (docs/design.md §3).
- **Steady CPU**: the sharder's user+system time (/proc/<pid>/stat) over %s
  once every object is on its instance, while every Lease renews; before
  it, and before each change, the run waits up to 15 s for the machine's
  CPUs to be quiet (a busy machine never is: see the load average). A
  profile of the sharder covers up to %s of it.
- **CPU per change**: the sharder's CPU from just before the change (a
  second before the added instance's Lease is due; a second before the
  killed instance expires, one lease duration after its last renewal, so
  that its expiry and the takeover a lease duration later both count)
  until every object is on its instance, plus %s for the ring's status write and the end of the
  sharder's hold of a dead instance's Lease, less the steady rate over the
  same time. Each change gets a CPU profile of %s from its start (the
  killed instance's, a lease duration longer), shown below when it missed
  a target.
- The changes, in this order: one instance added (the holder creates its
  Lease a lease duration after first finding it missing, as every instance
  does); one stopped gracefully (its Lease released); one killed (its
  holder stops renewing without a release, as after SIGKILL, and gives up
  at its renew deadline).
`, machine(p), p.revision, "`"+benchLabel+"`", "`"+cmp.Or(p.algorithm, sharderv1alpha1.DefaultAlgorithm)+"`", sharderv1alpha1.DefaultVirtualNodes, p.objects,
		extraArgs(append(append([]string(nil), p.sharderEnv...), p.sharderArgs...)),
		p.instances, p.leaseDuration, p.steady, scaleProfileCount, changeTail, p.profileDuration)
	return os.WriteFile(p.output, []byte(s.String()), 0o644) //nolint:gosec // a document of the repository, meant to be read
}

func algorithmFlag(algorithm string) string {
	if algorithm == "" {
		return ""
	}
	return " --algorithm " + algorithm
}

// sourceRevision returns the commit the sharder was built from, marked when
// the working tree differed from it.
func sourceRevision() string {
	out, err := exec.CommandContext(context.Background(), "git", "describe", "--always", "--dirty", "--exclude", "*").Output()
	if err != nil {
		return "unknown"
	}
	return "commit " + strings.TrimSpace(string(out))
}
