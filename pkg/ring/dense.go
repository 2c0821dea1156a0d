package ring

import (
	"fmt"

	"github.com/cespare/xxhash/v2"
)

// Parameters of the consistent-hash-dense algorithm. They are part of its
// placement: changing any of them moves keys. docs/ring.md gives the
// measurements they were chosen by.
const (
	// DensePartitionBits is the log2 of the number of partitions of a
	// consistent-hash-dense ring: a key belongs to partition
	// hash(key) >> (64 - DensePartitionBits). 2^22 partitions are about
	// 4,000 per instance at 1,000 instances, as many as the instance has
	// points, so that the partitions add little imbalance of their own.
	DensePartitionBits = 22
	// DensePointsPerWeight is the number of points per unit of weight: an
	// instance of the default weight 512 puts 4,096 points on the ring.
	DensePointsPerWeight = 8
	// MaxDensePoints caps the total number of points of a
	// consistent-hash-dense ring (2,048 instances of the default weight).
	// Above it, every member's point count is scaled down in proportion
	// (keeping at least 1), which keeps build time bounded but makes
	// membership changes move more keys than they must.
	MaxDensePoints = 1 << 23
	// MaxDenseMembers is the largest number of members of a
	// consistent-hash-dense ring: the partition table holds 16-bit member
	// indexes.
	MaxDenseMembers = 1<<16 - 1
)

const (
	densePartitions = 1 << DensePartitionBits
	// A point's position on the ring is the top denseFineBits+
	// DensePartitionBits bits of its hash: its partition and, below it, 16
	// bits that order the points of one partition.
	denseFineBits = 16
	// denseEmpty marks a partition without a point while the table is
	// built. No point packs to it: member indexes stay below 0xffff.
	denseEmpty = ^uint32(0)
	// denseGamma steps from one point of a member to the next before
	// mixing: the odd 64-bit golden-ratio constant, so that the first 2^64
	// steps from any seed are distinct.
	denseGamma = 0x9e3779b97f4a7c15
)

// buildDense builds a consistent-hash-dense ring: consistent hashing with
// many points per member and a partition table that makes a lookup one
// array read.
//
// A member of weight w puts w*DensePointsPerWeight points on the ring, at
// mix64(xxhash(ID) + j*denseGamma) for j = 0, 1, ...: a member's points
// depend on its ID and weight only, so adding or removing a member never
// moves another member's points. A partition belongs to the member of the
// first point at or after the partition's start (wrapping around), with
// points at the same position ordered by member ID. That order is the same
// in every membership, so a change moves only partitions to or from the
// members that changed.
//
// Unlike the consistent-hash algorithm, no point is sorted: the build keeps
// the first point of every partition in a table, then fills the empty
// partitions from their successors in one backward pass. Its cost is linear
// in the number of points plus the number of partitions.
func buildDense(members []Member) (Ring, error) {
	members, err := Normalize(members)
	if err != nil {
		return nil, err
	}
	switch {
	case len(members) == 0:
		return emptyRing{}, nil
	case len(members) == 1:
		return singleRing{memberList: members}, nil
	case len(members) > MaxDenseMembers:
		return nil, fmt.Errorf("%d members exceed the %d a %s ring holds", len(members), MaxDenseMembers, ConsistentHashDense)
	}
	points := densePointCounts(members)

	// first[p] packs the first point of partition p found so far: its
	// position within the partition in the high 16 bits, the member's index
	// (the members are sorted by ID) in the low 16. The smallest packed
	// value is the first point, and of points at the same position the one
	// of the smallest ID.
	first := make([]uint32, densePartitions)
	for p := range first {
		first[p] = denseEmpty
	}
	for i, m := range members {
		x := xxhash.Sum64String(m.ID)
		for range points[i] {
			h := mix64(x)
			x += denseGamma
			p := h >> (64 - DensePartitionBits)
			v := uint32(h>>(64-DensePartitionBits-denseFineBits))<<16 | uint32(i)
			if v < first[p] {
				first[p] = v
			}
		}
	}

	// A partition without a point belongs to the owner of the next
	// partition's first point; past the last point the ring wraps around to
	// the first.
	var next uint16
	for _, v := range first {
		if v != denseEmpty {
			next = uint16(v)
			break
		}
	}
	owners := make([]uint16, densePartitions)
	for p := densePartitions - 1; p >= 0; p-- {
		if v := first[p]; v != denseEmpty {
			next = uint16(v)
		}
		owners[p] = next
	}
	return &denseRing{memberList: members, owners: owners}, nil
}

// densePointCounts returns the number of points of each member: its weight
// times DensePointsPerWeight, scaled down in proportion when the total
// exceeds MaxDensePoints.
func densePointCounts(members []Member) []int {
	total := int64(totalWeight(members)) * DensePointsPerWeight
	counts := make([]int, len(members))
	for i, m := range members {
		n := int64(m.VirtualNodes) * DensePointsPerWeight
		if total > MaxDensePoints {
			n = max(1, n*MaxDensePoints/total)
		}
		counts[i] = int(n)
	}
	return counts
}

// denseRing is a built consistent-hash-dense ring: a read-only table from
// partition to member index.
type denseRing struct {
	memberList
	owners []uint16
}

func (r *denseRing) Lookup(key string) (string, error) {
	return r.memberList[r.owners[hashKey(key)>>(64-DensePartitionBits)]].ID, nil
}

// singleRing is the ring of one member, which owns every key.
type singleRing struct{ memberList }

func (r singleRing) Lookup(string) (string, error) { return r.memberList[0].ID, nil }
