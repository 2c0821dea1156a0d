package app

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/ring"
	"github.com/sharder-dev/sharder/pkg/sharder/simulation"
)

// simulateOptions are the flags of `sharder simulate`.
type simulateOptions struct {
	algorithm     string
	instances     int
	instanceNames string
	prefix        string
	seed          uint64
	keys          int
	keysFile      string
	virtualNodes  int
	weights       []int
	keysPerInst   int
	sweep         string
	partitions    int
	loadFactor    float64
	add, remove   int
	output        outputFormat

	build func([]ring.Member) (ring.Ring, error) // set by validate
	sizes []int                                  // set by validate from --sweep
}

// NewSimulateCommand returns `sharder simulate`.
func NewSimulateCommand() *cobra.Command {
	o := &simulateOptions{}
	cmd := &cobra.Command{
		Use:   "simulate",
		Short: "Simulate a ring offline: balance and movement on membership changes",
		Long: `simulate places keys on a ring of generated instances, as the sharder would,
and reports how many keys every instance holds. With --add or --remove it also
reports how many keys the membership change moves, next to the fewest any
algorithm must move while keeping the shares equal.

Keys are generated (--keys) or read from a file with one key per line
(--keys-file), e.g. exported from a cluster as <group>/<Kind>/<namespace>/<name>.

maxOverMean and minOverMean compare the largest and smallest instance with its
fair share (the mean, for equal weights); movedFraction is the fraction of keys
that changed instance, idealMovedFraction the fraction that must, and
movedOverIdeal the first over the second. buildTime is the wall time building
the ring before the change took.

--sweep measures many ring sizes at once, one line per size: balance, the keys
moved by adding one instance and by removing one over the ideal, and the build
time. Give it --keys-per-instance so that every size is measured with as many
keys per instance.`,
		Example: `  # 10 StatefulSet pods, default algorithm and weight; what does an 11th move?
  sharder simulate --instances 10 --add 1

  # Compare algorithms on your own keys, as JSON
  sharder simulate --algorithm rendezvous --instances 5 --remove 1 --keys-file keys.txt -o json

  # A large ring with mixed weights, 10,000 keys per instance
  sharder simulate --algorithm consistent-hash-dense --instances 1000 --weights 256,512,1024 --keys-per-instance 10000 --add 1

  # Every size from 2 to 10, then 20 to 100 by 10 and 200 to 1,000 by 100
  sharder simulate --algorithm consistent-hash-dense --sweep 2-10,20-100:10,200-1000:100 --keys-per-instance 10000`,
		Args: cobra.NoArgs,
		PreRunE: func(cmd *cobra.Command, _ []string) error {
			return o.validate(cmd)
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd.InOrStdin(), cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.algorithm, "algorithm", ring.ConsistentHash, "ring algorithm: "+strings.Join(ring.Algorithms(), ", "))
	f.IntVar(&o.instances, "instances", 10, "number of instances before the change")
	f.StringVar(&o.instanceNames, "instance-names", string(simulation.StatefulSet),
		"how instance IDs look: statefulset (<prefix>-0, <prefix>-1, ...) or deployment (<prefix>-<hash>-<random>)")
	f.StringVar(&o.prefix, "prefix", "instance", "prefix of the generated instance IDs")
	f.Uint64Var(&o.seed, "seed", 0, "seed of generated keys, deployment-style names and which instances --remove picks among them")
	f.IntVar(&o.keys, "keys", 20000, "number of generated keys")
	f.StringVar(&o.keysFile, "keys-file", "", "file with one key per line instead of generated keys (- for stdin); blank lines and repeats are skipped")
	f.IntVar(&o.virtualNodes, "virtual-nodes", v1alpha1.DefaultVirtualNodes, "weight of every instance (sharder.dev/virtual-nodes)")
	f.IntSliceVar(&o.weights, "weights", nil, "weights of the instances in turn, instead of --virtual-nodes (e.g. 256,512,1024: the first instance 256, the second 512, ...)")
	f.IntVar(&o.keysPerInst, "keys-per-instance", 0, "generate this many keys per instance instead of --keys (with --sweep: per instance of every size)")
	f.StringVar(&o.sweep, "sweep", "", "ring sizes to measure one after another instead of --instances, --add and --remove: a comma-separated list of N, A-B (every size) or A-B:STEP")
	f.IntVar(&o.partitions, "partitions", ring.DefaultPartitionCount, "consistent-hash: number of partitions keys are hashed into")
	f.Float64Var(&o.loadFactor, "load-factor", ring.DefaultLoadFactor, "consistent-hash: bound on a virtual node's load relative to the mean (0: no bound, else > 1)")
	f.IntVar(&o.add, "add", 0, "instances to add for the membership change")
	f.IntVar(&o.remove, "remove", 0, "instances to remove for the membership change (the highest ordinals for statefulset names)")
	addOutputFlag(cmd, &o.output)
	return cmd
}

// validate checks the flags and prepares the ring builder.
func (o *simulateOptions) validate(cmd *cobra.Command) error {
	var errs []error
	if o.instances < 1 {
		errs = append(errs, fmt.Errorf("--instances must be at least 1, got %d", o.instances))
	}
	if o.instanceNames != string(simulation.StatefulSet) && o.instanceNames != string(simulation.Deployment) {
		errs = append(errs, fmt.Errorf("--instance-names must be %s or %s, got %q", simulation.StatefulSet, simulation.Deployment, o.instanceNames))
	}
	if o.prefix == "" {
		errs = append(errs, errors.New("--prefix must not be empty"))
	}
	if n := countChanged(cmd, "keys", "keys-file", "keys-per-instance"); n > 1 {
		errs = append(errs, errors.New("--keys, --keys-file and --keys-per-instance are mutually exclusive"))
	}
	if cmd.Flags().Changed("keys-per-instance") && o.keysPerInst < 1 {
		errs = append(errs, fmt.Errorf("--keys-per-instance must be at least 1, got %d", o.keysPerInst))
	}
	if cmd.Flags().Changed("weights") && cmd.Flags().Changed("virtual-nodes") {
		errs = append(errs, errors.New("--weights and --virtual-nodes are mutually exclusive"))
	}
	if cmd.Flags().Changed("weights") && len(o.weights) == 0 {
		errs = append(errs, errors.New("--weights must name at least one weight"))
	}
	for _, w := range o.weights {
		if w < 1 || w > membership.MaxVirtualNodes {
			errs = append(errs, fmt.Errorf("--weights must be in [1, %d], got %d", membership.MaxVirtualNodes, w))
			break
		}
	}
	if o.sweep != "" {
		var err error
		if o.sizes, err = parseSizes(o.sweep); err != nil {
			errs = append(errs, fmt.Errorf("--sweep: %w", err))
		}
		if countChanged(cmd, "instances", "add", "remove") > 0 {
			errs = append(errs, errors.New("--sweep replaces --instances, --add and --remove"))
		}
	}
	if o.keysFile == "" && o.keys < 1 {
		errs = append(errs, fmt.Errorf("--keys must be at least 1, got %d", o.keys))
	}
	if o.virtualNodes < 1 || o.virtualNodes > membership.MaxVirtualNodes {
		errs = append(errs, fmt.Errorf("--virtual-nodes must be in [1, %d], got %d", membership.MaxVirtualNodes, o.virtualNodes))
	}
	if o.add < 0 {
		errs = append(errs, fmt.Errorf("--add must not be negative, got %d", o.add))
	}
	if o.remove < 0 {
		errs = append(errs, fmt.Errorf("--remove must not be negative, got %d", o.remove))
	} else if o.instances >= 1 && o.remove >= o.instances {
		errs = append(errs, fmt.Errorf("--remove %d must leave at least one of the %d instances", o.remove, o.instances))
	}
	if o.partitions < 1 {
		errs = append(errs, fmt.Errorf("--partitions must be at least 1, got %d", o.partitions))
	}
	known := ring.Algorithms()
	switch {
	case !slices.Contains(known, o.algorithm):
		errs = append(errs, fmt.Errorf("--algorithm %q is not one of %s", o.algorithm, strings.Join(known, ", ")))
	case o.algorithm == ring.ConsistentHash:
		a, err := ring.NewConsistentHash(ring.ConsistentHashOptions{PartitionCount: o.partitions, LoadFactor: o.loadFactor})
		if err != nil {
			errs = append(errs, fmt.Errorf("--partitions/--load-factor: %w", err))
		} else {
			o.build = a.Build
		}
	case cmd.Flags().Changed("partitions") || cmd.Flags().Changed("load-factor"):
		errs = append(errs, fmt.Errorf("--partitions and --load-factor apply to %s only, not %s", ring.ConsistentHash, o.algorithm))
	}
	return errors.Join(errs...)
}

// countChanged returns how many of the named flags were set.
func countChanged(cmd *cobra.Command, names ...string) int {
	n := 0
	for _, name := range names {
		if cmd.Flags().Changed(name) {
			n++
		}
	}
	return n
}

// parseSizes parses --sweep: comma-separated N, A-B or A-B:STEP, each at
// least 1, in the order given.
func parseSizes(spec string) ([]int, error) {
	var sizes []int
	for item := range strings.SplitSeq(spec, ",") {
		bounds, stepText, hasStep := strings.Cut(strings.TrimSpace(item), ":")
		fromText, toText, isRange := strings.Cut(bounds, "-")
		from, err := strconv.Atoi(fromText)
		to, step := from, 1
		if err == nil && isRange {
			to, err = strconv.Atoi(toText)
		}
		if err == nil && hasStep {
			step, err = strconv.Atoi(stepText)
		}
		switch {
		case err != nil || hasStep && !isRange:
			return nil, fmt.Errorf("%q is not N, A-B or A-B:STEP", item)
		case from < 1 || to < from || step < 1:
			return nil, fmt.Errorf("%q: sizes must be at least 1, ranges ascending, steps at least 1", item)
		}
		for n := from; n <= to; n += step {
			sizes = append(sizes, n)
		}
	}
	return sizes, nil
}

func (o *simulateOptions) run(stdin io.Reader, out io.Writer) error {
	var keys []string
	switch {
	case o.keysFile != "":
		var err error
		if keys, err = readKeys(o.keysFile, stdin); err != nil {
			return err
		}
	case o.keysPerInst > 0 && o.sizes != nil:
		keys = simulation.Keys(o.keysPerInst*slices.Max(o.sizes), o.seed)
	case o.keysPerInst > 0:
		keys = simulation.Keys(o.keysPerInst*o.instances, o.seed)
	default:
		keys = simulation.Keys(o.keys, o.seed)
	}
	opts := simulation.Options{
		Algorithm:    o.algorithm,
		Build:        o.build,
		Instances:    o.instances,
		Names:        simulation.NameStyle(o.instanceNames),
		Prefix:       o.prefix,
		VirtualNodes: o.virtualNodes,
		Weights:      o.weights,
		Keys:         keys,
		Add:          o.add,
		Remove:       o.remove,
		Seed:         o.seed,
	}
	var res any
	var err error
	if o.sizes != nil {
		perInstance := 0
		if o.keysFile == "" {
			perInstance = o.keysPerInst
		}
		res, err = simulation.Sweep(opts, o.sizes, perInstance)
	} else {
		res, err = simulation.Run(opts)
	}
	if err != nil {
		return fmt.Errorf("simulating: %w", err)
	}
	if o.output.structured() {
		return writeStructured(out, o.output, res)
	}
	if sizes, ok := res.([]simulation.Size); ok {
		return writeSweepTable(out, o.algorithm, sizes)
	}
	return writeTable(out, res.(*simulation.Result))
}

// readKeys reads one key per line from path ("-": stdin), skipping blank lines
// and repeated keys.
func readKeys(path string, stdin io.Reader) ([]string, error) {
	r := stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("reading keys: %w", err)
		}
		defer func() { _ = f.Close() }()
		r = f
	}
	var keys []string
	seen := map[string]bool{}
	s := bufio.NewScanner(r)
	s.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for s.Scan() {
		key := strings.TrimSpace(s.Text())
		if key == "" || seen[key] {
			continue
		}
		seen[key] = true
		keys = append(keys, key)
	}
	if err := s.Err(); err != nil {
		return nil, fmt.Errorf("reading keys from %s: %w", path, err)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("reading keys from %s: no keys", path)
	}
	return keys, nil
}

func writeTable(out io.Writer, res *simulation.Result) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	changed := res.After != nil
	after := map[string]simulation.Instance{}
	for _, in := range res.After {
		after[in.ID] = in
	}
	if changed {
		_, _ = fmt.Fprintln(w, "INSTANCE\tVIRTUAL NODES\tKEYS\tKEYS AFTER\tCHANGE")
	} else {
		_, _ = fmt.Fprintln(w, "INSTANCE\tVIRTUAL NODES\tKEYS")
	}
	for _, in := range res.Instances {
		if !changed {
			_, _ = fmt.Fprintf(w, "%s\t%d\t%d\n", in.ID, in.VirtualNodes, in.Keys)
			continue
		}
		keysAfter := "-"
		if a, ok := after[in.ID]; ok {
			keysAfter = fmt.Sprint(a.Keys)
		}
		_, _ = fmt.Fprintf(w, "%s\t%d\t%d\t%s\t%s\n", in.ID, in.VirtualNodes, in.Keys, keysAfter, in.State)
	}
	for _, a := range res.After {
		if a.State == "added" {
			_, _ = fmt.Fprintf(w, "%s\t%d\t-\t%d\t%s\n", a.ID, a.VirtualNodes, a.Keys, a.State)
		}
	}
	_, _ = fmt.Fprintln(w)
	_, _ = fmt.Fprintf(w, "algorithm\t%s\n", res.Algorithm)
	_, _ = fmt.Fprintf(w, "keys\t%d\n", res.Keys)
	_, _ = fmt.Fprintf(w, "maxOverMean\t%.3f\n", res.MaxOverMean)
	_, _ = fmt.Fprintf(w, "minOverMean\t%.3f\n", res.MinOverMean)
	_, _ = fmt.Fprintf(w, "buildTime\t%s\n", formatSeconds(res.BuildSeconds))
	if changed {
		_, _ = fmt.Fprintf(w, "maxOverMean after\t%.3f\n", res.AfterMaxOverMean)
		_, _ = fmt.Fprintf(w, "minOverMean after\t%.3f\n", res.AfterMinOverMean)
		_, _ = fmt.Fprintf(w, "movedFraction\t%.4f (%d keys)\n", res.MovedFraction, res.Moved)
		_, _ = fmt.Fprintf(w, "idealMovedFraction\t%.4f\n", res.IdealMovedFraction)
		_, _ = fmt.Fprintf(w, "movedOverIdeal\t%.3f\n", res.MovedOverIdeal)
	}
	return w.Flush()
}

// writeSweepTable writes one line per ring size.
func writeSweepTable(out io.Writer, algorithm string, sizes []simulation.Size) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
	_, _ = fmt.Fprintf(w, "INSTANCES\tKEYS\tMAX/MEAN\tMIN/MEAN\tADD MOVED/IDEAL\tREMOVE MOVED/IDEAL\tBUILD\t\n")
	for _, s := range sizes {
		remove := "-"
		if s.Instances > 1 {
			remove = fmt.Sprintf("%.3f", s.RemoveMovedOverIdeal)
		}
		_, _ = fmt.Fprintf(w, "%d\t%d\t%.3f\t%.3f\t%.3f\t%s\t%s\t\n",
			s.Instances, s.Keys, s.MaxOverMean, s.MinOverMean, s.AddMovedOverIdeal, remove, formatSeconds(s.BuildSeconds))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	hi, add, remove, build := 0.0, 0.0, 0.0, 0.0
	for _, s := range sizes {
		hi, add = max(hi, s.MaxOverMean), max(add, s.AddMovedOverIdeal)
		remove, build = max(remove, s.RemoveMovedOverIdeal), max(build, s.BuildSeconds)
	}
	_, err := fmt.Fprintf(out, "\n%s, %d sizes: largest max/mean %.3f, add moved/ideal %.3f, remove moved/ideal %.3f, build %s\n",
		algorithm, len(sizes), hi, add, remove, formatSeconds(build))
	return err
}

// formatSeconds prints a duration in seconds to the millisecond, or to the
// microsecond below one millisecond.
func formatSeconds(s float64) string {
	d := time.Duration(s * float64(time.Second))
	if d < time.Millisecond {
		return d.Round(time.Microsecond).String()
	}
	return d.Round(time.Millisecond).String()
}
