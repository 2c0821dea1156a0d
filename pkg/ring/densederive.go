package ring

import (
	"slices"
	"sync"

	"github.com/cespare/xxhash/v2"
)

// denseAlgorithm is the consistent-hash-dense algorithm: buildDense, and
// deriveDense for a ring built from the one before.
type denseAlgorithm struct{}

func (denseAlgorithm) Build(members []Member) (Ring, error) { return buildDense(members) }

func (denseAlgorithm) Derive(prev Ring, members []Member) (Ring, error) {
	return deriveDense(prev, members)
}

var _ Deriver = denseAlgorithm{}

// maxDerivedChanges is the most members added, removed or reweighted at
// once that deriveDense handles by derivation; more are built anew.
const maxDerivedChanges = 64

// deriveDense returns the consistent-hash-dense ring of members (normalized)
// from prev, a ring of the same algorithm built for a membership that
// differs by a few members added, removed or reweighted. It gives the same
// ring as buildDense(members), in time that grows with the points of the
// members that changed (and, for a removal, the points of every member),
// rather than with the partitions:
//
//   - the new ring shares prev's chunks (prev is read by others meanwhile
//     and stays as it is): it copies its table of chunk pointers and then
//     only each chunk in which a partition changes, on its first change
//     (about 2,500 of the 32,768 chunks, 1.4 MiB, when one member of 1,000
//     joins or leaves); a member keeps its slot, so that the partitions of
//     the members kept do not change;
//   - a member removed (or the old weight of a reweighted one) hands over
//     the partitions whose first point was its own, found from its points:
//     the only step that reads every member's points, once for all the
//     members removed, keeping those in the partitions lost (a pass with no
//     writes but to those), so that removals cost about a quarter of a
//     build;
//   - a member added (or the new weight of a reweighted one) takes a free
//     slot and places its points: a partition whose first point it becomes
//     changes owner, and so do the partitions without a point just before
//     it.
//
// It builds from nothing when prev is not a consistent-hash-dense ring with
// at least two members, when the ring would have fewer than two, when
// either ring's points are scaled down (MaxDensePoints: every member's point
// count then depends on the others), or when more than maxDerivedChanges
// members changed.
func deriveDense(prev Ring, members []Member) (Ring, error) {
	p, ok := prev.(*denseRing)
	if !ok || p.chunks == nil || len(members) < 2 || len(members) > MaxDenseMembers ||
		int64(totalWeight(p.memberList))*DensePointsPerWeight > MaxDensePoints ||
		int64(totalWeight(members))*DensePointsPerWeight > MaxDensePoints {
		return buildDense(members)
	}
	// slots[j] is the slot of members[j] kept from prev; removed holds the
	// indexes in prev of the members removed or reweighted, added the new
	// indexes of the members added or reweighted.
	slots := make([]uint16, len(members))
	inUse := make([]bool, len(p.ids), max(len(p.ids), len(members)))
	var removed, added []int
	for i, j := 0, 0; i < len(p.memberList) || j < len(members); {
		switch {
		case j == len(members) || i < len(p.memberList) && p.memberList[i].ID < members[j].ID:
			removed = append(removed, i)
			i++
		case i == len(p.memberList) || members[j].ID < p.memberList[i].ID:
			added = append(added, j)
			j++
		default:
			if p.memberList[i].VirtualNodes != members[j].VirtualNodes {
				removed = append(removed, i)
				added = append(added, j)
			} else {
				slots[j] = p.slots[i]
				inUse[slots[j]] = true
			}
			i, j = i+1, j+1
		}
		if len(removed)+len(added) > maxDerivedChanges {
			return buildDense(members)
		}
	}
	// The members added take the free slots, the lowest first (those of
	// the members removed among them), then new ones.
	ids := make([]string, len(p.ids), cap(inUse))
	for s, used := range inUse {
		if used {
			ids[s] = p.ids[s]
		}
	}
	free := 0
	for _, j := range added {
		for free < len(inUse) && inUse[free] {
			free++
		}
		if free == len(inUse) {
			inUse, ids = append(inUse, false), append(ids, "")
		}
		inUse[free], ids[free] = true, members[j].ID
		slots[j] = uint16(free)
	}

	d := &denseDerivation{r: &denseRing{memberList: members, ids: ids, slots: slots, chunks: new([denseChunks]*denseChunk)}}
	*d.r.chunks = *p.chunks
	// touched lists the partitions whose first point changed or went: the
	// partitions without a point before each of them are filled again last.
	var touched []uint32
	counts := densePointCounts(members)
	if len(removed) > 0 {
		lost := lostPartitions.Get().(*[densePartitions / 64]uint64)
		prevCounts := densePointCounts(p.memberList)
		for _, i := range removed {
			touched = d.remove(p.memberList[i].ID, p.slots[i], prevCounts[i], lost, touched)
		}
		// The partitions that lost their first point take the first of the
		// remaining points of the members kept; those added come next.
		if len(touched) > 0 {
			for j := range members {
				if !slices.Contains(added, j) {
					d.place(j, counts[j], lost, nil)
				}
			}
		}
		for _, q := range touched {
			lost[q/64] = 0
		}
		lostPartitions.Put(lost)
	}
	for _, j := range added {
		touched = d.place(j, counts[j], nil, touched)
	}
	for _, q := range touched {
		d.fillBefore(q)
	}
	return d.r, nil
}

// lostPartitions holds a bitmap of partitions (a *[densePartitions/64]uint64,
// all 0) for the next derivation that removes a member.
var lostPartitions = sync.Pool{New: func() any { return new([densePartitions / 64]uint64) }}

// denseDerivation is a ring being derived (deriveDense): r's chunks are
// prev's but for those copied (the bits of copied), which are r's own.
type denseDerivation struct {
	r      *denseRing
	copied [denseChunks / 64]uint64
}

// chunk returns the chunk of partition q for writing: r's own, copied from
// the one r shares on first use.
func (d *denseDerivation) chunk(q uint32) *denseChunk {
	c := q / denseChunkSize
	if d.copied[c/64]&(1<<(c%64)) == 0 {
		d.copied[c/64] |= 1 << (c % 64)
		own := new(denseChunk)
		*own = *d.r.chunks[c]
		d.r.chunks[c] = own
	}
	return d.r.chunks[c]
}

// remove takes away the n points of the member of the given ID and slot: it
// clears the first point of each partition whose first point was one of
// them, marks it in lost and appends it to touched, which it returns.
func (d *denseDerivation) remove(id string, slot uint16, n int, lost *[densePartitions / 64]uint64, touched []uint32) []uint32 {
	x := xxhash.Sum64String(id)
	for range n {
		h := mix64(x)
		x += denseGamma
		q := uint32(h >> (64 - DensePartitionBits))
		fine := uint16(h >> (64 - DensePartitionBits - denseFineBits)) //nolint:gosec // the 16 bits below the partition's
		c, i := d.r.chunks[q/denseChunkSize], q%denseChunkSize
		if c.has[i/64]&(1<<(i%64)) == 0 || c.fine[i] != fine || c.owners[i] != slot {
			continue
		}
		c = d.chunk(q)
		c.has[i/64] &^= 1 << (i % 64)
		c.fine[i] = 0 // as a build leaves a partition without a point
		lost[q/64] |= 1 << (q % 64)
		touched = append(touched, q)
	}
	return touched
}

// place puts the n points of member j on r, in the partitions of only when
// only is not nil: a point becomes its partition's first point when it
// comes before the first so far (at the same position, when its member's ID
// sorts first). It returns touched with every partition whose first point
// it changed appended.
func (d *denseDerivation) place(j, n int, only *[densePartitions / 64]uint64, touched []uint32) []uint32 {
	id := d.r.memberList[j].ID
	x := xxhash.Sum64String(id)
	slot := d.r.slots[j]
	for range n {
		h := mix64(x)
		x += denseGamma
		q := uint32(h >> (64 - DensePartitionBits))
		if only != nil && only[q/64]&(1<<(q%64)) == 0 {
			continue
		}
		fine := uint16(h >> (64 - DensePartitionBits - denseFineBits)) //nolint:gosec // the 16 bits below the partition's
		c, i := d.r.chunks[q/denseChunkSize], q%denseChunkSize
		if c.has[i/64]&(1<<(i%64)) != 0 {
			if first := c.fine[i]; fine > first || fine == first && id > d.r.ids[c.owners[i]] {
				continue
			}
		}
		c = d.chunk(q)
		c.has[i/64] |= 1 << (i % 64)
		c.fine[i], c.owners[i] = fine, slot
		if only == nil {
			touched = append(touched, q)
		}
	}
	return touched
}

// fillBefore gives the partitions without a point before the first partition
// with one at or after q (wrapping around) that partition's owner, copying
// only the chunks in which an owner changes. The ring has at least one
// point.
func (d *denseDerivation) fillBefore(q uint32) {
	const mask = densePartitions - 1
	r := d.r
	for !r.has(q) {
		q = (q + 1) & mask
	}
	owner := r.chunks[q/denseChunkSize].owners[q%denseChunkSize]
	for p := (q - 1) & mask; !r.has(p); p = (p - 1) & mask {
		if r.chunks[p/denseChunkSize].owners[p%denseChunkSize] != owner {
			d.chunk(p).owners[p%denseChunkSize] = owner
		}
	}
}
