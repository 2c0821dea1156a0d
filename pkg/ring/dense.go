package ring

import (
	"fmt"
	"runtime"
	"sync"

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
	// denseBucketBits: the build sorts points into 2^denseBucketBits
	// buckets of consecutive partitions (see denseOwners).
	denseBucketBits = 11
	denseBuckets    = 1 << denseBucketBits
	// A build of at least denseParallelPoints points runs on up to
	// denseMaxWorkers processors (a power of 2, at most denseBuckets).
	denseParallelPoints = 1 << 20
	denseMaxWorkers     = 4
	// denseEmpty marks a partition without a point while the table is
	// built. No point packs to it: member indexes stay below 0xffff.
	denseEmpty = ^uint32(0)
	// A ring's tables are split into chunks of 2^denseChunkBits
	// consecutive partitions (denseChunk), which a derived ring shares with
	// the ring it is derived from until one of their partitions changes.
	denseChunkBits = 7
	denseChunkSize = 1 << denseChunkBits
	denseChunks    = densePartitions / denseChunkSize
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
// The consistent-hash algorithm's library re-sorts its points after adding
// each member, which costs time growing with the square of the points. This
// build never sorts: it groups the points by range of partitions (a counting
// pass and a storing pass), keeps the first point of every partition, and
// fills the partitions without a point from their successors in one
// backward pass. Its time is linear in the number of points plus the number
// of partitions; it holds 8 bytes per point while it runs, and the ring
// 4 bytes and a bit per partition (16.5 MiB, in chunks of denseChunkSize
// partitions, 18 MiB with the allocator's rounding): the table, and each
// partition's first point, from which the next ring is derived
// (deriveDense).
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
	r := &denseRing{memberList: members, ids: make([]string, len(members)), slots: make([]uint16, len(members)), chunks: new([denseChunks]*denseChunk)}
	for i, m := range members {
		r.ids[i], r.slots[i] = m.ID, uint16(i)
	}
	denseOwners(members, densePointCounts(members), r.chunks)
	return r, nil
}

// denseOwners allocates the chunks of a ring of members, with points[i]
// points for members[i], and fills their partition table with member indexes
// (a built ring's slots).
//
// Points are generated twice: once to count how many fall in each of
// 2^denseBucketBits buckets (ranges of consecutive partitions), then to
// store each in its bucket's part of one array. A bucket's partitions then
// fit in the processor's first-level cache while their points are read, so
// that the build does not pay a cache miss per point, as it would by
// updating a table of every partition in the order points are generated.
//
// Large rings are built by up to denseMaxWorkers goroutines: each counts and
// stores the points of its share of the members, then fills the table for
// its share of the buckets. The table does not depend on how the work was
// shared: the points of a bucket are compared by value, in any order.
//
// It also records in the chunks which partitions hold a point and the
// position within its partition of each one's first point: what a derived
// ring starts from (deriveDense).
func denseOwners(members []Member, points []int, chunks *[denseChunks]*denseChunk) {
	total := 0
	for _, n := range points {
		total += n
	}
	workers := 1
	for total >= denseParallelPoints && workers < min(runtime.GOMAXPROCS(0), denseMaxWorkers) {
		workers *= 2
	}
	// Members split into workers runs of about equal points.
	firstMember := make([]int, workers+1)
	for k, i, sum := 1, 0, 0; k < workers; k++ {
		for ; i < len(members) && sum < total*k/workers; i++ {
			sum += points[i]
		}
		firstMember[k] = i
	}
	firstMember[workers] = len(members)

	counts := make([][denseBuckets]int, workers)
	parallel(workers, func(k int) {
		for i := firstMember[k]; i < firstMember[k+1]; i++ {
			x := xxhash.Sum64String(members[i].ID)
			for range points[i] {
				counts[k][mix64(x)>>(64-denseBucketBits)]++
				x += denseGamma
			}
		}
	})
	// Bucket b holds the points of worker 0, then of worker 1, ... from
	// starts[b]; next[k][b] is where worker k stores its next point of b.
	var starts [denseBuckets + 1]int
	next := make([][denseBuckets]int, workers)
	for b, at := 0, 0; b < denseBuckets; b++ {
		starts[b] = at
		for k := range next {
			next[k][b] = at
			at += counts[k][b]
		}
		starts[b+1] = at
	}

	buffer := storedPoints.Get().(*[]uint64)
	defer storedPoints.Put(buffer)
	if cap(*buffer) < total {
		*buffer = make([]uint64, total)
	}
	stored := (*buffer)[:total]
	// A point is stored as its position below the bucket's bits (the
	// partition within the bucket, then denseFineBits bits within the
	// partition) above the member's index (the members are sorted by ID).
	// Of two points, the smaller value is the first on the ring, or, at
	// the same position, the one of the smaller ID.
	const below = DensePartitionBits - denseBucketBits + denseFineBits
	parallel(workers, func(k int) {
		next := &next[k]
		for i := firstMember[k]; i < firstMember[k+1]; i++ {
			x := xxhash.Sum64String(members[i].ID)
			for range points[i] {
				h := mix64(x)
				x += denseGamma
				b := h >> (64 - denseBucketBits)
				stored[next[b]] = (h<<denseBucketBits)>>(64-below)<<16 | uint64(i) //nolint:gosec // a member index, below MaxDenseMembers
				next[b]++
			}
		}
	})

	// A partition without a point belongs to the owner of the next
	// partition's first point, so each worker fills its buckets from the
	// last partition to the first. The partitions after the last point of
	// a worker's buckets take the first point of the next worker's buckets
	// that have one (past the last point of the ring, the first point),
	// once all are done.
	const bucketPartitions = 1 << (DensePartitionBits - denseBucketBits)
	span := denseBuckets / workers * bucketPartitions // partitions per worker
	firstPoint, lastPoint := make([]int, workers), make([]int, workers)
	parallel(workers, func(k int) {
		var first [bucketPartitions]uint32 // of each partition of a bucket
		owner := -1
		firstPoint[k], lastPoint[k] = -1, -1
		for b := (k+1)*span/bucketPartitions - 1; b >= k*span/bucketPartitions; b-- {
			for p := range first {
				first[p] = denseEmpty
			}
			for _, v := range stored[starts[b]:starts[b+1]] {
				if p, low := v>>32, uint32(v&0xffffffff); low < first[p] {
					first[p] = low
				}
			}
			// Each chunk is allocated on its own, so that a derived
			// ring keeps alive only the chunks it shares.
			for c := b * bucketPartitions / denseChunkSize; c < (b+1)*bucketPartitions/denseChunkSize; c++ {
				chunks[c] = new(denseChunk)
			}
			for p := bucketPartitions - 1; p >= 0; {
				at := b*bucketPartitions + p
				c := chunks[at/denseChunkSize]
				for i := at % denseChunkSize; i >= 0; i, p, at = i-1, p-1, at-1 {
					if first[p] != denseEmpty {
						owner = int(first[p] & 0xffff)
						c.fine[i] = uint16(first[p] >> 16)
						c.has[i/64] |= 1 << (i % 64)
						firstPoint[k] = at
						if lastPoint[k] < 0 {
							lastPoint[k] = firstPoint[k]
						}
					}
					if owner >= 0 {
						c.owners[i] = uint16(owner)
					}
				}
			}
		}
	})
	for k := range workers {
		after := k + 1 // the first worker after k whose buckets have a point
		for firstPoint[after%workers] < 0 {
			after++
		}
		from := k * span
		if lastPoint[k] >= 0 {
			from = lastPoint[k] + 1
		}
		at := firstPoint[after%workers]
		owner := chunks[at/denseChunkSize].owners[at%denseChunkSize]
		for p := from; p < (k+1)*span; p++ {
			chunks[p/denseChunkSize].owners[p%denseChunkSize] = owner
		}
	}
}

// parallel calls f(0), ..., f(n-1) in n goroutines, or in this one for n 1,
// and returns when all have returned.
func parallel(n int, f func(k int)) {
	if n == 1 {
		f(0)
		return
	}
	var wg sync.WaitGroup
	for k := range n {
		wg.Go(func() { f(k) })
	}
	wg.Wait()
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

// storedPoints holds the points of a build (a *[]uint64) for the next one: a
// build of 1,000 instances of the default weight stores 32 MiB of points,
// and allocating that anew each time would make the garbage collector work
// harder (and the build wait for it) while other work fills the heap.
var storedPoints = sync.Pool{New: func() any { return new([]uint64) }}

// denseRing is a built consistent-hash-dense ring: a read-only table from
// partition to member, in chunks that rings derived from one another share
// (deriveDense). Neither a chunk nor the ring changes once the ring is
// returned.
type denseRing struct {
	memberList
	// The table holds slots rather than member indexes, so that adding or
	// removing a member leaves the entries of the others unchanged: ids
	// has the ID of the member in each slot ("" for a slot free since a
	// member was removed), slots the slot of each member of memberList. A
	// built ring's slot i is its member i.
	ids    []string
	slots  []uint16
	chunks *[denseChunks]*denseChunk
}

// denseChunk holds the table of denseChunkSize consecutive partitions.
type denseChunk struct {
	owners [denseChunkSize]uint16 // the slot of each partition's owner
	// fine is, for each partition with a point, the position of its first
	// point within the partition (the denseFineBits below the partition's
	// bits), 0 for the others; has has the bit of each partition with a
	// point. Lookup does not read them: a derived ring starts from them.
	fine [denseChunkSize]uint16
	has  [denseChunkSize / 64]uint64
}

func (r *denseRing) Lookup(key string) (string, error) { return r.LookupHash(hashKey(key)) }

func (r *denseRing) LookupHash(h uint64) (string, error) {
	q := h >> (64 - DensePartitionBits)
	return r.ids[r.chunks[q/denseChunkSize].owners[q%denseChunkSize]], nil
}

// owner returns the ID of the owner of partition q.
func (r *denseRing) owner(q uint32) string {
	return r.ids[r.chunks[q/denseChunkSize].owners[q%denseChunkSize]]
}

// has reports whether partition q holds a point.
func (r *denseRing) has(q uint32) bool {
	i := q % denseChunkSize
	return r.chunks[q/denseChunkSize].has[i/64]&(1<<(i%64)) != 0
}

// singleRing is the ring of one member, which owns every key.
type singleRing struct{ memberList }

func (r singleRing) Lookup(string) (string, error)     { return r.memberList[0].ID, nil }
func (r singleRing) LookupHash(uint64) (string, error) { return r.memberList[0].ID, nil }
