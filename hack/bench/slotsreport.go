package main

import (
	"fmt"
	"os"
	"strings"
)

// report renders the slots mode's results as Markdown.
func (s *slotsRun) report() string {
	var out strings.Builder
	out.WriteString(table(s.rows, false))
	s.rec.mu.Lock()
	fmt.Fprintf(&out, "\nLease renewals seen over the run (not counted above): %d. Reconciles per instance ID over the run:", s.rec.renewals)
	for _, id := range sortedKeys(s.rec.perInst) {
		fmt.Fprintf(&out, " %s %d;", id, s.rec.perInst[id])
	}
	s.rec.mu.Unlock()
	out.WriteString("\n")
	return out.String()
}

func sortedKeys(m map[string]int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	for i := 1; i < len(keys); i++ {
		for j := i; j > 0 && keys[j] < keys[j-1]; j-- {
			keys[j], keys[j-1] = keys[j-1], keys[j]
		}
	}
	return keys
}

// writeSlotsReport writes the slots mode's report with the machine and the
// method to p.output.
func writeSlotsReport(p params, report string) error {
	var s strings.Builder
	fmt.Fprintf(&s, `# Benchmarks of slot mode

Figures of the sharder serving one ring of unit Slots (docs/design.md §11)
with %[1]d objects and %[2]d instances, against a local control plane (etcd
and kube-apiserver on the same machine), produced by %[8]s
(`+"`go run ./hack/bench --slots%[7]s --objects %[9]d --large-objects %[3]d --instances %[2]d --slot-count %[4]d --create-workers %[5]d%[6]s --output %[10]s`"+`),
which rewrites this file: the reading at its end is written by hand, to be
written again for new figures. It runs by hand, not in `+"`make test`"+`.

## Results

`, p.existingObjects+p.objects, p.instances, p.largeObjects, p.slotCount, p.workers, slotsExtraFlags(p),
		existingArg(p.existingObjects), makeTarget(p.output), p.objects, p.output)
	s.WriteString(report)
	fmt.Fprintf(&s, `
## Machine

%[1]s| sharder built from | %[2]s |

The control plane, the sharder and the benchmark process (which runs every
instance, watches every object, Lease and the ring, and creates the
objects) share these CPUs; other work ran on the machine too, so every time
is given with the load average (1, 5, 15 minutes) when it was taken. Write
counts do not depend on the load.

## Method

- One ring over ConfigMaps without data in one namespace labelled %[3]s=true,
  spec.assignment unit Slots, %[4]d slots, key Object, mode Admission. The
  sharder runs as one replica with leader election (its default timings,
  a lease of 15 s), its webhooks, metrics and profiling endpoint on, and its
  default settings otherwise. Its binary is built as the release builds
  build it (CGO_ENABLED=0, -trimpath, -ldflags '-s -w'; internal/localrun),
  so that its RSS counts the pages of the binary users run.
- **Instances**: %[5]d full instances of pkg/instance in slot mode, each a
  controller-runtime manager in this process with instance.NewCache over
  ConfigMaps, authenticated as the ring's instance service account, lease
  duration %[6]s, renew period a fifth of it. The first instances release
  their Lease as restarting on a graceful stop (Options.Lease.Release =
  leaseholder.ReleaseRestart, a StatefulSet's pods: the ring's restartHold,
  30 s by default, keeps their slots), the one added by the scale-out as
  stopped for good (ReleaseStop, the default: its slots move at once). The reconciler (through
  Instance.Wrap, so admitted by the instance's slot record) records the
  instance, the object's slot and the time, and does nothing else.
- **Objects**: %[11]sonce the instances hold every slot, the objects are created
  by %[7]d parallel requests over protobuf through the assigning webhook,
  which writes the slot label into each create; then the run waits until
  the instances reconciled every object.
- **Writes** are counted from watches started before anything else: the
  ring (every resourceVersion change after its creation: status writes of
  the slot table and the counts), the ring's Leases (creations, deletions,
  and every update that changes anything but spec.renewTime; of these, an
  update that raises sharder.dev/slots-acknowledged is an acknowledgement) and the ring's objects
  (every update: resourceVersion changed, from when every object carried
  its label). The target's count excludes renewals, and so the
  acknowledgements too (design §11: a renewal brought forward, not a write
  of its own); they are given beside it.
- **A membership change** starts with the action (an instance started with
  a new ID; that instance stopped gracefully, so that it releases its
  Lease for good; for the rolling restart, each instance in turn stopped gracefully
  and started again with the same ID, the next one after the ring settled)
  and is counted until the ring settled (the latest slot table grants every
  slot to the live instances in equal shares within one slot, none
  releasing, and each instance's slot record equals its granted slots)
  and each moved slot (with objects) was reconciled by its new holder (a
  minute at most), plus %[8]s.
- **Hand-over**: for each slot whose holder changed between the tables
  before and after a change, the time from the Lease write carrying the old
  holder's acknowledgement of the revision that released it (as this
  process's watch saw it) to the new holder's first reconcile of an object
  of that slot: the grant, the new holder's list of the slot and the
  queue included. A slot whose old holder was gone (no acknowledgement) is
  timed from the table write that granted it. The target (every moved
  slot within 2 s of the acknowledgement, plus its list) takes the list's
  time from one LIST of all the new holder's slots, as its slot cache
  lists the watch groups it starts together, timed (median of three) just
  after the change.
- **Sharder CPU** per change: utime + stime of the sharder process from
  /proc over the change's window. **RSS**: VmRSS (and its parts RssAnon
  and RssFile, from /proc/<pid>/status) 30 s after the instances
  reconciled the first %[10]d objects (before the changes), and, when
  --large-objects is above that, again 30 s after creating objects up to %[9]d
  through the webhook; live heap: HeapAlloc after a garbage collection
  (heap profile with gc=1).
`, machine(p), p.revision, "`"+benchLabel+"`", p.slotCount, p.instances, p.leaseDuration, p.workers, slotGrace, p.largeObjects, p.existingObjects+p.objects,
		existingMethod(p.existingObjects))
	return os.WriteFile(p.output, []byte(s.String()), 0o644) //nolint:gosec // a document of the repository, meant to be read
}

// slotsExtraFlags are the command line's flags beyond those the report
// always names: a lease duration other than the default, and the sharder's
// extra environment and arguments.
func slotsExtraFlags(p params) string {
	var b strings.Builder
	if p.leaseDuration != defaultLeaseDuration {
		fmt.Fprintf(&b, " --lease-duration %s", p.leaseDuration)
	}
	for _, e := range p.sharderEnv {
		fmt.Fprintf(&b, " --sharder-env=%s", e)
	}
	for _, a := range p.sharderArgs {
		fmt.Fprintf(&b, " --sharder-arg=%s", a)
	}
	return b.String()
}

// existingArg is the --existing-objects flag of the command line, if set.
func existingArg(n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(" --existing-objects %d", n)
}

// makeTarget names the make target that writes output, or says that the
// command was run by hand.
func makeTarget(output string) string {
	if output == "docs/benchmarks-slots.md" {
		return "`make bench-slots`"
	}
	return "hand"
}

// existingMethod says how the --existing-objects objects were made.
func existingMethod(n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(`first, before the sharder and the instances
  start, %d objects are created with the slot label the assigning webhook
  would give them (the same function of their key), so that the run does
  not wait for that many admissions; then, `, n)
}
