package simulation

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"time"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/ring"
)

// NameStyle is how generated instance IDs look.
type NameStyle string

const (
	// StatefulSet names instances like the pods of a StatefulSet:
	// <prefix>-0, <prefix>-1, ...; added instances take the next ordinals
	// and removed ones are the highest ordinals, as when scaling.
	StatefulSet NameStyle = "statefulset"
	// Deployment names instances like the pods of a Deployment:
	// <prefix>-<hash>-<suffix> with random suffixes; removed instances are
	// picked at random.
	Deployment NameStyle = "deployment"
)

// Options of a simulation.
type Options struct {
	// Algorithm is the ring algorithm's name. Default: ring.ConsistentHash.
	Algorithm string
	// Build builds the rings instead of ring.New(Algorithm, ...), e.g. with
	// non-default consistent-hash options. Default: nil (ring.New).
	Build func(members []ring.Member) (ring.Ring, error)
	// Instances is the number of instances before the change; at least 1.
	Instances int
	// Names is how instance IDs are generated. Default: StatefulSet.
	Names NameStyle
	// Prefix of generated instance IDs. Default: "instance".
	Prefix string
	// VirtualNodes is every instance's weight, unless Weights is set.
	// Default: v1alpha1.DefaultVirtualNodes (the ControllerRing default).
	VirtualNodes int
	// Weights, when set, are the instances' weights in turn: the i-th
	// generated instance (added ones included) has Weights[i%len(Weights)].
	// Default: nil (VirtualNodes for all).
	Weights []int
	// Keys are the keys to place; at least one.
	Keys []string
	// Add instances after the first placement. Default: 0.
	Add int
	// Remove instances after the first placement; fewer than Instances.
	// Default: 0.
	Remove int
	// Seed makes generated names and the choice of removed instances
	// reproducible. Default: 0.
	Seed uint64
}

// Instance is one instance's share of the keys.
type Instance struct {
	ID           string `json:"id"`
	VirtualNodes int    `json:"virtualNodes"`
	Keys         int    `json:"keys"`
	// State is "added" or "removed" for instances of the change, empty
	// otherwise.
	State string `json:"state,omitempty"`
}

// Result of a simulation. Over-mean figures compare the instance holding the
// most (least) keys with the mean per unit of weight, so that they are 1.0
// for a perfect share also when weights differ.
type Result struct {
	Algorithm    string     `json:"algorithm"`
	Keys         int        `json:"keys"`
	VirtualNodes int        `json:"virtualNodes"`
	Instances    []Instance `json:"instances"`
	MaxOverMean  float64    `json:"maxOverMean"`
	MinOverMean  float64    `json:"minOverMean"`
	// BuildSeconds is the wall time building the ring before the change
	// took, after a garbage collection so that the build does not share
	// the processor with one the keys' memory would call for.
	BuildSeconds float64 `json:"buildSeconds"`

	// Set when Options asked for a change (Add or Remove).
	After              []Instance `json:"after,omitempty"`
	AfterMaxOverMean   float64    `json:"afterMaxOverMean,omitempty"`
	AfterMinOverMean   float64    `json:"afterMinOverMean,omitempty"`
	Moved              int        `json:"moved"`
	MovedFraction      float64    `json:"movedFraction"`
	IdealMovedFraction float64    `json:"idealMovedFraction"`
	// MovedOverIdeal is MovedFraction / IdealMovedFraction: 1.0 is the
	// fewest keys any algorithm keeping the shares fair could move.
	MovedOverIdeal float64 `json:"movedOverIdeal,omitempty"`
}

func (o *Options) setDefaults() {
	if o.Algorithm == "" {
		o.Algorithm = ring.ConsistentHash
	}
	if o.Names == "" {
		o.Names = StatefulSet
	}
	if o.Prefix == "" {
		o.Prefix = "instance"
	}
	if o.VirtualNodes == 0 {
		o.VirtualNodes = v1alpha1.DefaultVirtualNodes
	}
	if o.Build == nil {
		algorithm := o.Algorithm
		o.Build = func(members []ring.Member) (ring.Ring, error) { return ring.New(algorithm, members) }
	}
}

// Validate reports what is wrong with o, after defaults.
func (o Options) Validate() error {
	o.setDefaults()
	var errs []error
	if o.Instances < 1 {
		errs = append(errs, fmt.Errorf("instances must be at least 1, got %d", o.Instances))
	}
	if o.Names != StatefulSet && o.Names != Deployment {
		errs = append(errs, fmt.Errorf("instance names must be %q or %q, got %q", StatefulSet, Deployment, o.Names))
	}
	for _, w := range append([]int{o.VirtualNodes}, o.Weights...) {
		if w < 1 || w > membership.MaxVirtualNodes {
			errs = append(errs, fmt.Errorf("virtual nodes must be in [1, %d], got %d", membership.MaxVirtualNodes, w))
			break
		}
	}
	if len(o.Keys) == 0 {
		errs = append(errs, errors.New("no keys to place"))
	}
	if o.Add < 0 || o.Remove < 0 {
		errs = append(errs, fmt.Errorf("add and remove must not be negative, got %d and %d", o.Add, o.Remove))
	}
	if o.Remove >= o.Instances && o.Instances >= 1 {
		errs = append(errs, fmt.Errorf("cannot remove %d of %d instances: at least one must remain", o.Remove, o.Instances))
	}
	return errors.Join(errs...)
}

// Run places opts.Keys on the membership of opts, then on the membership after
// the change, and measures both.
func Run(opts Options) (*Result, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts.setDefaults()
	rng := rand.New(rand.NewPCG(opts.Seed, 0x5ead)) //nolint:gosec // reproducible from the seed on purpose
	names := InstanceNames(opts.Names, opts.Prefix, opts.Instances+opts.Add, rng)
	weights := make(map[string]int, len(names))
	for i, id := range names {
		weights[id] = opts.VirtualNodes
		if len(opts.Weights) > 0 {
			weights[id] = opts.Weights[i%len(opts.Weights)]
		}
	}
	before := names[:opts.Instances]
	added := names[opts.Instances:]
	removed := map[string]bool{}
	if opts.Names == StatefulSet {
		for _, id := range before[len(before)-opts.Remove:] {
			removed[id] = true
		}
	} else {
		for _, i := range rng.Perm(len(before))[:opts.Remove] {
			removed[before[i]] = true
		}
	}
	var after []string
	for _, id := range names {
		if !removed[id] {
			after = append(after, id)
		}
	}

	res := &Result{Algorithm: opts.Algorithm, Keys: len(opts.Keys), VirtualNodes: opts.VirtualNodes}
	placeBefore, build, err := place(opts, before, weights, true)
	if err != nil {
		return nil, err
	}
	res.BuildSeconds = build.Seconds()
	res.Instances, res.MaxOverMean, res.MinOverMean = share(before, weights, placeBefore, removed, nil)
	if opts.Add == 0 && opts.Remove == 0 {
		return res, nil
	}
	placeAfter, _, err := place(opts, after, weights, false)
	if err != nil {
		return nil, err
	}
	addedSet := map[string]bool{}
	for _, id := range added {
		addedSet[id] = true
	}
	res.After, res.AfterMaxOverMean, res.AfterMinOverMean = share(after, weights, placeAfter, nil, addedSet)
	for i := range placeBefore {
		if placeBefore[i] != placeAfter[i] {
			res.Moved++
		}
	}
	res.MovedFraction = float64(res.Moved) / float64(len(opts.Keys))
	res.IdealMovedFraction = idealMovedFraction(before, after, weights)
	if res.IdealMovedFraction > 0 {
		res.MovedOverIdeal = res.MovedFraction / res.IdealMovedFraction
	}
	return res, nil
}

// idealMovedFraction is IdealMovedFraction for weighted instances: the
// shares of the removed instances, plus what every kept instance loses when
// its share goes from its weight over the total before to its weight over
// the total after.
func idealMovedFraction(before, after []string, weights map[string]int) float64 {
	total := func(ids []string) (sum float64) {
		for _, id := range ids {
			sum += float64(weights[id])
		}
		return sum
	}
	totalBefore, totalAfter := total(before), total(after)
	kept := make(map[string]bool, len(after))
	for _, id := range after {
		kept[id] = true
	}
	moved := 0.0
	for _, id := range before {
		share := float64(weights[id]) / totalBefore
		if !kept[id] {
			moved += share
		} else if loss := share - float64(weights[id])/totalAfter; loss > 0 {
			moved += loss
		}
	}
	return moved
}

// IdealMovedFraction is the smallest fraction of keys a change of equally
// weighted instances from n to n+add-remove moves while keeping the shares
// equal: the shares removed instances held, plus what the remaining ones
// hand over to the added ones.
func IdealMovedFraction(n, add, remove int) float64 {
	kept := n - remove
	after := kept + add
	if n <= 0 || after <= 0 {
		return 0
	}
	// Every kept instance goes from 1/n to 1/after; what any of them loses
	// moves, plus everything of the removed ones.
	moved := float64(remove) / float64(n)
	if loss := 1/float64(n) - 1/float64(after); loss > 0 {
		moved += float64(kept) * loss
	}
	return moved
}

// place returns the owner of every key on the membership ids, and the time
// building the ring took; timed collects garbage first, for a time that is
// the build's own.
func place(opts Options, ids []string, weights map[string]int, timed bool) ([]string, time.Duration, error) {
	members := make([]ring.Member, len(ids))
	for i, id := range ids {
		members[i] = ring.Member{ID: id, VirtualNodes: weights[id]}
	}
	if timed {
		runtime.GC()
	}
	start := time.Now()
	r, err := opts.Build(members)
	build := time.Since(start)
	if err != nil {
		return nil, 0, fmt.Errorf("building %s ring of %d instances: %w", opts.Algorithm, len(ids), err)
	}
	owners := make([]string, len(opts.Keys))
	for i, key := range opts.Keys {
		if owners[i], err = r.Lookup(key); err != nil {
			return nil, 0, fmt.Errorf("looking up key %q: %w", key, err)
		}
	}
	return owners, build, nil
}

// share counts the keys of every instance and the largest and smallest
// count over the instance's fair share (the keys times its weight over the
// total weight).
func share(ids []string, weights map[string]int, owners []string, removed, added map[string]bool) ([]Instance, float64, float64) {
	counts := map[string]int{}
	for _, o := range owners {
		counts[o]++
	}
	total := 0
	for _, id := range ids {
		total += weights[id]
	}
	out := make([]Instance, 0, len(ids))
	lo, hi := -1.0, 0.0
	for _, id := range ids {
		in := Instance{ID: id, VirtualNodes: weights[id], Keys: counts[id]}
		switch {
		case removed[id]:
			in.State = "removed"
		case added[id]:
			in.State = "added"
		}
		out = append(out, in)
		r := float64(in.Keys) / (float64(len(owners)) * float64(in.VirtualNodes) / float64(total))
		hi = max(hi, r)
		if lo < 0 || r < lo {
			lo = r
		}
	}
	slices.SortFunc(out, func(a, b Instance) int { return compareIDs(a.ID, b.ID) })
	return out, hi, lo
}
