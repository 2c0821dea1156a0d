package slots

import (
	"fmt"
	"hash/fnv"
	"math/bits"

	"github.com/cespare/xxhash/v2"
	"k8s.io/apimachinery/pkg/sharding"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// Of returns the slot of hash h among count slots: the index of the one of
// count equal ranges of the 64-bit hash space that holds h, ⌊h × count /
// 2^64⌋. For a uniform hash it is as even as h mod count, and it makes each
// slot a range of the hash (Start), which the API server's shard selector
// selects. count must be positive.
func Of(h uint64, count int) int {
	hi, _ := bits.Mul64(h, uint64(count)) //nolint:gosec // a slot count is positive
	return int(hi)                        //nolint:gosec // below count
}

// ForObjectKey returns the slot of a main object of a ring of key Object:
// Of the 64-bit xxHash of its hash key (v1alpha1.ObjectKey), the hash object
// mode's algorithms apply to the same key.
func ForObjectKey(key string, count int) int { return Of(xxhash.Sum64String(key), count) }

// ForNamespace returns the slot of a main object of a ring of key
// Namespace: Of the 64-bit FNV-1a hash of its namespace, the hash of the
// API server's sharded list and watch. Cluster-scoped objects (namespace
// "") share one slot.
func ForNamespace(namespace string, count int) int { return Of(HashNamespace(namespace), count) }

// HashNamespace is the 64-bit FNV-1a hash of namespace, as the API server
// hashes object.metadata.namespace for a shard selector.
func HashNamespace(namespace string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(namespace))
	return h.Sum64()
}

// Start returns the first hash of slot among count slots: the smallest h
// with Of(h, count) == slot, ⌈slot × 2^64 / count⌉. A slot's hashes are
// [Start(slot), Start(slot+1)), the last slot's up to 2^64. It panics
// unless 0 <= slot < count.
func Start(slot, count int) uint64 {
	if slot < 0 || slot >= count {
		panic(fmt.Sprintf("slot %d out of [0, %d)", slot, count))
	}
	q, r := bits.Div64(uint64(slot), 0, uint64(count)) //nolint:gosec // 0 <= slot < count, checked above
	if r != 0 {
		q++
	}
	return q
}

// MaxGroups bounds the watch groups of a ring: an instance runs at most one
// watch per resource and group.
const MaxGroups = 64

// Groups returns the number of watch groups of count slots: MaxGroups, or
// count when fewer.
func Groups(count int) int { return min(count, MaxGroups) }

// Group returns the watch group of slot among count slots: groups are runs
// of consecutive slots of (nearly) equal length, ⌊slot × Groups / count⌋.
func Group(slot, count int) int { return slot * Groups(count) / count }

// NamespaceField is the field a ring of key Namespace is sharded by in a
// shard selector.
const NamespaceField = "object.metadata.namespace"

// ShardSelector returns the API server's shard selector of slots among
// count slots of a ring of key Namespace: one shardRange on the namespace
// per run of consecutive slots. slots must be ascending, within [0, count);
// no slot selects nothing (sharding.Everything: pass at least one).
func ShardSelector(slots []int, count int) sharding.Selector {
	var reqs []sharding.ShardRangeRequirement
	for i := 0; i < len(slots); {
		j := i
		for j+1 < len(slots) && slots[j+1] == slots[j]+1 {
			j++
		}
		end := "0x10000000000000000" // 2^64, the end of the last slot
		if slots[j]+1 < count {
			end = fmt.Sprintf("0x%016x", Start(slots[j]+1, count))
		}
		reqs = append(reqs, sharding.ShardRangeRequirement{
			Key:   NamespaceField,
			Start: fmt.Sprintf("0x%016x", Start(slots[i], count)),
			End:   end,
		})
		i = j + 1
	}
	return sharding.NewSelector(reqs...)
}

// ForMainObject returns the slot of a main object of a ring in slot mode,
// from its hash key or its namespace as spec.assignment.slots.key says,
// among the ring's slot count. A controlled object takes its controller's
// slot instead, whatever this says of it. It hashes the key's parts
// (v1alpha1.ObjectKeyHash) instead of building the key: it allocates
// nothing (the sharder decides it for every object it labels and every
// admission).
func ForMainObject(spec *v1alpha1.ControllerRingSpec, group, kind, namespace, name string) int {
	count := spec.EffectiveSlotCount()
	if spec.EffectiveSlotKey() == v1alpha1.SlotKeyNamespace {
		return ForNamespace(namespace, count)
	}
	return Of(v1alpha1.ObjectKeyHash(group, kind, namespace, name), count)
}

// ParseLabel returns the slot a slot label's value names among count
// slots, or an error when it names none (the ring's policy refuses such a
// value on every object it guards).
func ParseLabel(value string, count int) (int, error) { return parseSlot(value, count) }
