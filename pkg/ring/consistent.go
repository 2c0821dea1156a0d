package ring

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"

	"github.com/buraksezer/consistent"
)

// Defaults of the consistent-hash algorithm, chosen by measurement (see
// docs/ring.md and BenchmarkBalance).
const (
	// DefaultPartitionCount is the number of partitions keys are hashed
	// into. Instances own partitions, not keys: the partition count bounds
	// how finely the key space is shared and must stay fixed for a ring,
	// since changing it moves almost every key.
	DefaultPartitionCount = 65536
	// DefaultLoadFactor 0 disables the bound on the load of a virtual node,
	// so that a membership change only moves the keys it must.
	DefaultLoadFactor = 0
	// MaxRingVirtualNodes is the largest total of virtual nodes a
	// consistent-hash ring holds. Above it, every member's weight is scaled
	// down in proportion (keeping at least 1), which keeps build time bounded
	// and leaves at least one partition per virtual node.
	MaxRingVirtualNodes = 32768
)

// ConsistentHashOptions configure the consistent-hash algorithm.
type ConsistentHashOptions struct {
	// PartitionCount is the number of partitions keys are hashed into; it
	// must be at least 1 and at most 1<<24. Rings built with different
	// partition counts place keys differently.
	// Default: DefaultPartitionCount.
	PartitionCount int
	// LoadFactor, when above 1, bounds the partitions a virtual node may own
	// to LoadFactor times the mean (consistent hashing with bounded loads):
	// better balance with few virtual nodes, at the price of moving some keys
	// between remaining instances on every membership change. 0 means no
	// bound. Values in (0, 1] are invalid.
	// Default: DefaultLoadFactor (no bound).
	LoadFactor float64
}

func (o *ConsistentHashOptions) setDefaults() {
	if o.PartitionCount == 0 {
		o.PartitionCount = DefaultPartitionCount
	}
}

// NewConsistentHash returns the consistent-hash algorithm with opts. The
// algorithm registered as ConsistentHash uses the zero options.
//
// Each member of weight w is placed on the hash ring as w virtual nodes named
// after its ID; keys are hashed (xxHash) into PartitionCount partitions, and
// each partition belongs to the virtual node that follows the partition's
// hash on the ring. Adding or removing a member therefore moves only the
// partitions the change must move (with LoadFactor 0).
func NewConsistentHash(opts ConsistentHashOptions) (Algorithm, error) {
	opts.setDefaults()
	if opts.PartitionCount < 1 || opts.PartitionCount > 1<<24 {
		return nil, fmt.Errorf("partition count %d out of range [1, %d]", opts.PartitionCount, 1<<24)
	}
	if opts.LoadFactor != 0 && !(opts.LoadFactor > 1 && opts.LoadFactor <= 1e6) {
		return nil, fmt.Errorf("load factor %v must be 0 (no bound) or in (1, 1e6]", opts.LoadFactor)
	}
	return consistentHash{opts: opts}, nil
}

var defaultConsistentHash = consistentHash{opts: ConsistentHashOptions{PartitionCount: DefaultPartitionCount}}

type consistentHash struct {
	opts ConsistentHashOptions
}

// virtualNode is a member of the library's ring: one virtual node of an
// instance.
type virtualNode struct {
	name     string
	instance int32 // index into the ring's members
	point    uint64
}

func (v virtualNode) String() string { return v.name }

// virtualNodeName names the j-th virtual node of id. The library hashes
// name+"0" for the node's position; a length prefix and the closing '/' make
// the name (and so that string) unique for every (id, j), whatever
// characters id holds: "op-1"+"20" and "op-12"+"0" must not meet.
func virtualNodeName(id string, j int) string {
	b := make([]byte, 0, len(id)+16)
	b = strconv.AppendInt(b, int64(len(id)), 10)
	b = append(b, ':')
	b = append(b, id...)
	b = append(b, '/')
	b = strconv.AppendInt(b, int64(j), 10)
	b = append(b, '/')
	return string(b)
}

// scaledWeights returns the number of virtual nodes of each member, scaled
// down so that their total stays within limit.
func scaledWeights(members []Member, limit int) []int {
	total := totalWeight(members)
	weights := make([]int, len(members))
	for i, m := range members {
		w := m.VirtualNodes
		if total > limit {
			w = max(1, int(int64(w)*int64(limit)/int64(total)))
		}
		weights[i] = w
	}
	return weights
}

func (a consistentHash) Build(members []Member) (r Ring, err error) {
	members, err = Normalize(members)
	if err != nil {
		return nil, err
	}
	partitions := a.opts.PartitionCount
	switch {
	case len(members) == 0:
		return emptyRing{}, nil
	case len(members) == 1:
		// The library cannot place partitions on a ring of one point; the
		// answer is known anyway.
		return &partitionRing{memberList: members, owners: make([]int32, partitions)}, nil
	}
	limit := min(MaxRingVirtualNodes, partitions)
	if len(members) > limit {
		return nil, fmt.Errorf("%d members exceed the %d virtual nodes a ring of %d partitions can hold", len(members), limit, partitions)
	}
	weights := scaledWeights(members, limit)
	hasher := xxHasher{}
	var nodes []consistent.Member
	for i, m := range members {
		for j := range weights[i] {
			name := virtualNodeName(m.ID, j)
			nodes = append(nodes, virtualNode{name: name, instance: int32(i), point: hasher.Sum64([]byte(name + "0"))})
		}
	}
	// The library keeps its points sorted by re-sorting after each node;
	// adding nodes in point order makes every sort a linear pass. Equal
	// points (a 64-bit collision) are ordered by name so that the outcome
	// does not depend on the input order either.
	slices.SortFunc(nodes, func(x, y consistent.Member) int {
		a, b := x.(virtualNode), y.(virtualNode)
		return cmp.Or(cmp.Compare(a.point, b.point), cmp.Compare(a.name, b.name))
	})
	load := a.opts.LoadFactor
	if load == 0 {
		// A bound no virtual node can reach: the library's per-node limit
		// is ceil(floor(partitions/nodes) * load) >= partitions.
		load = float64(partitions)
	} else if !roomGuaranteed(len(nodes), partitions, load) {
		return nil, fmt.Errorf("load factor %v leaves no room for %d partitions on %d virtual nodes", load, partitions, len(nodes))
	}
	c, err := newConsistent(nodes, consistent.Config{
		Hasher:            hasher,
		PartitionCount:    partitions,
		ReplicationFactor: 1,
		Load:              load,
	})
	if err != nil {
		return nil, err
	}
	owners := make([]int32, partitions)
	for p := range owners {
		owner, ok := c.GetPartitionOwner(p).(virtualNode)
		if !ok {
			return nil, fmt.Errorf("partition %d has no owner", p)
		}
		owners[p] = owner.instance
	}
	return &partitionRing{memberList: members, owners: owners}, nil
}

// roomGuaranteed reports whether the library can place every partition on
// nodes single-point virtual nodes with load factor load without running out
// of room. Each node may own limit = ceil(floor(partitions/nodes)*load)
// partitions. The library searches at most nodes-1 points from a partition's
// position, so it finds room as long as two nodes have room, which holds
// while placing the last partition if (nodes-1)*limit >= partitions.
func roomGuaranteed(nodes, partitions int, load float64) bool {
	if nodes < 2 || partitions < nodes {
		return false
	}
	limit := math.Ceil(float64(partitions/nodes) * load)
	return float64(nodes-1)*limit >= float64(partitions)
}

// newConsistent calls consistent.New, turning its panics ("not enough room to
// distribute partitions") into errors. Build's parameters are chosen so that
// it cannot panic; this is the second line of defense.
func newConsistent(nodes []consistent.Member, cfg consistent.Config) (c *consistent.Consistent, err error) {
	defer func() {
		if p := recover(); p != nil {
			c, err = nil, fmt.Errorf("distributing %d partitions over %d virtual nodes: %v", cfg.PartitionCount, len(nodes), p)
		}
	}()
	c = consistent.New(nodes, cfg)
	if c == nil {
		return nil, errors.New("no ring")
	}
	return c, nil
}

// partitionRing is a built consistent-hash ring: a read-only table from
// partition to member, so Lookup takes no lock.
type partitionRing struct {
	memberList
	owners []int32
}

func (r *partitionRing) Lookup(key string) (string, error) { return r.LookupHash(hashKey(key)) }

func (r *partitionRing) LookupHash(h uint64) (string, error) {
	return r.memberList[r.owners[h%uint64(len(r.owners))]].ID, nil
}
