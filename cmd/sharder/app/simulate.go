package app

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/ring"
	"github.com/sharder-dev/sharder/pkg/ring/simulation"
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
	partitions    int
	loadFactor    float64
	add, remove   int
	output        string

	build func([]ring.Member) (ring.Ring, error) // set by validate
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

maxOverMean and minOverMean compare the largest and smallest instance with the
mean; movedFraction is the fraction of keys that changed instance and
idealMovedFraction the fraction that must.`,
		Example: `  # 10 StatefulSet pods, default algorithm and weight; what does an 11th move?
  sharder simulate --instances 10 --add 1

  # Compare algorithms on your own keys, as JSON
  sharder simulate --algorithm rendezvous --instances 5 --remove 1 --keys-file keys.txt -o json`,
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
	f.IntVar(&o.partitions, "partitions", ring.DefaultPartitionCount, "consistent-hash: number of partitions keys are hashed into")
	f.Float64Var(&o.loadFactor, "load-factor", ring.DefaultLoadFactor, "consistent-hash: bound on a virtual node's load relative to the mean (0: no bound, else > 1)")
	f.IntVar(&o.add, "add", 0, "instances to add for the membership change")
	f.IntVar(&o.remove, "remove", 0, "instances to remove for the membership change (the highest ordinals for statefulset names)")
	f.StringVarP(&o.output, "output", "o", "table", "output format: table or json")
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
	if cmd.Flags().Changed("keys") && cmd.Flags().Changed("keys-file") {
		errs = append(errs, errors.New("--keys and --keys-file are mutually exclusive"))
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
	if o.output != "table" && o.output != "json" {
		errs = append(errs, fmt.Errorf("--output must be table or json, got %q", o.output))
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

func (o *simulateOptions) run(stdin io.Reader, out io.Writer) error {
	var keys []string
	if o.keysFile != "" {
		var err error
		if keys, err = readKeys(o.keysFile, stdin); err != nil {
			return err
		}
	} else {
		keys = simulation.Keys(o.keys, o.seed)
	}
	res, err := simulation.Run(simulation.Options{
		Algorithm:    o.algorithm,
		Build:        o.build,
		Instances:    o.instances,
		Names:        simulation.NameStyle(o.instanceNames),
		Prefix:       o.prefix,
		VirtualNodes: o.virtualNodes,
		Keys:         keys,
		Add:          o.add,
		Remove:       o.remove,
		Seed:         o.seed,
	})
	if err != nil {
		return fmt.Errorf("simulating: %w", err)
	}
	if o.output == "json" {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	return writeTable(out, res)
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
	if changed {
		_, _ = fmt.Fprintf(w, "maxOverMean after\t%.3f\n", res.AfterMaxOverMean)
		_, _ = fmt.Fprintf(w, "minOverMean after\t%.3f\n", res.AfterMinOverMean)
		_, _ = fmt.Fprintf(w, "movedFraction\t%.4f (%d keys)\n", res.MovedFraction, res.Moved)
		_, _ = fmt.Fprintf(w, "idealMovedFraction\t%.4f\n", res.IdealMovedFraction)
	}
	return w.Flush()
}
