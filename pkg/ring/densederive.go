package ring

import (
	"slices"

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

// removedMember marks, in the index map of a derivation, a member that is not
// in the new ring.
const removedMember = ^uint16(0)

// deriveDense returns the consistent-hash-dense ring of members (normalized)
// from prev, a ring of the same algorithm built for a membership that
// differs by a few members added, removed or reweighted. It gives the same
// ring as buildDense(members), in time that grows with the partitions (the
// ring's table is copied: prev is read by others meanwhile) and the points
// of the members that changed, rather than with the points of every member:
//
//   - a member added (or the new weight of a reweighted one) places its
//     points: a partition whose first point it becomes changes owner, and
//     so do the partitions without a point just before it;
//   - a member removed (or the old weight of a reweighted one) hands over
//     the partitions whose first point was its own: the only step that reads
//     every member's points, once for all the members removed, keeping those
//     in the partitions lost (a pass with no writes but to those), so that
//     removals cost about a quarter of a build.
//
// It builds from nothing when prev is not a consistent-hash-dense ring with
// at least two members, when the ring would have fewer than two, when
// either ring's points are scaled down (MaxDensePoints: every member's point
// count then depends on the others), or when more than maxDerivedChanges
// members changed.
func deriveDense(prev Ring, members []Member) (Ring, error) {
	p, ok := prev.(*denseRing)
	if !ok || p.firstPoint == nil || len(members) < 2 || len(members) > MaxDenseMembers ||
		int64(totalWeight(p.memberList))*DensePointsPerWeight > MaxDensePoints ||
		int64(totalWeight(members))*DensePointsPerWeight > MaxDensePoints {
		return buildDense(members)
	}
	// index[i] is the new index of prev's member i, removedMember for one
	// removed or reweighted; added holds the new indexes of the members
	// added or reweighted.
	index := make([]uint16, len(p.memberList))
	var added []int
	removed := 0
	for i, j := 0, 0; i < len(p.memberList) || j < len(members); {
		switch {
		case j == len(members) || i < len(p.memberList) && p.memberList[i].ID < members[j].ID:
			index[i] = removedMember
			removed++
			i++
		case i == len(p.memberList) || members[j].ID < p.memberList[i].ID:
			added = append(added, j)
			j++
		default:
			index[i] = uint16(j)
			if p.memberList[i].VirtualNodes != members[j].VirtualNodes {
				index[i] = removedMember
				removed++
				added = append(added, j)
			}
			i, j = i+1, j+1
		}
		if removed+len(added) > maxDerivedChanges {
			return buildDense(members)
		}
	}

	r := &denseRing{
		memberList: members,
		owners:     make([]uint16, densePartitions),
		firstPoint: slices.Clone(p.firstPoint),
		hasPoint:   slices.Clone(p.hasPoint),
	}
	// touched lists the partitions whose first point changed or went: the
	// partitions without a point before each of them are filled again last.
	var touched []uint32
	for q, o := range p.owners {
		o = index[o]
		r.owners[q] = o
		if o == removedMember && r.has(uint32(q)) {
			r.hasPoint[q/64] &^= 1 << (q % 64)
			r.firstPoint[q] = 0 // as a build leaves a partition without a point
			touched = append(touched, uint32(q))
		}
	}
	counts := densePointCounts(members)
	if len(touched) > 0 {
		// The partitions that lost their first point take the first of the
		// remaining points of the members kept; those added come next.
		lost := make([]uint64, densePartitions/64)
		for _, q := range touched {
			lost[q/64] |= 1 << (q % 64)
		}
		for j := range members {
			if !slices.Contains(added, j) {
				r.place(j, counts[j], lost, nil)
			}
		}
	}
	for _, j := range added {
		touched = r.place(j, counts[j], nil, touched)
	}
	for _, q := range touched {
		r.fillBefore(q)
	}
	return r, nil
}

// has reports whether partition q holds a point.
func (r *denseRing) has(q uint32) bool { return r.hasPoint[q/64]&(1<<(q%64)) != 0 }

// place puts the n points of member j on r, in the partitions of only when
// only is not nil: a point becomes its partition's first point when it
// comes before the first so far (at the same position, when its member's ID
// sorts first). It returns touched with every partition whose first point
// it changed appended.
func (r *denseRing) place(j, n int, only []uint64, touched []uint32) []uint32 {
	x := xxhash.Sum64String(r.memberList[j].ID)
	owner := uint16(j) //nolint:gosec // below MaxDenseMembers
	for range n {
		h := mix64(x)
		x += denseGamma
		q := uint32(h >> (64 - DensePartitionBits))
		if only != nil && only[q/64]&(1<<(q%64)) == 0 {
			continue
		}
		fine := uint16(h >> (64 - DensePartitionBits - denseFineBits)) //nolint:gosec // the 16 bits below the partition's
		if r.has(q) {
			if first := r.firstPoint[q]; fine > first || fine == first && owner > r.owners[q] {
				continue
			}
		}
		r.hasPoint[q/64] |= 1 << (q % 64)
		r.firstPoint[q], r.owners[q] = fine, owner
		if only == nil {
			touched = append(touched, q)
		}
	}
	return touched
}

// fillBefore gives the partitions without a point before the first partition
// with one at or after q (wrapping around) that partition's owner. The ring
// has at least one point.
func (r *denseRing) fillBefore(q uint32) {
	const mask = densePartitions - 1
	for !r.has(q) {
		q = (q + 1) & mask
	}
	owner := r.owners[q]
	for p := (q - 1) & mask; !r.has(p); p = (p - 1) & mask {
		r.owners[p] = owner
	}
}
