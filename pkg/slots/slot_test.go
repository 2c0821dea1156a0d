package slots

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/sharding"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/ring"
)

// TestStartBoundsEachSlot: Start(s) is the first hash of slot s, for slot
// counts that divide 2^64 and counts that do not.
func TestStartBoundsEachSlot(t *testing.T) {
	g := NewWithT(t)
	rnd := rand.New(rand.NewPCG(1, 2))
	for _, count := range []int{1, 2, 3, 7, 64, 100, 256, 1000, 1024, 4096, 16383, 16384} {
		g.Expect(Start(0, count)).To(BeZero())
		for range 200 {
			s := rnd.IntN(count)
			g.Expect(Of(Start(s, count), count)).To(Equal(s), "count %d slot %d", count, s)
			if s > 0 {
				g.Expect(Of(Start(s, count)-1, count)).To(Equal(s-1), "count %d slot %d", count, s)
			}
		}
		g.Expect(Of(^uint64(0), count)).To(Equal(count - 1))
	}
	g.Expect(func() { Start(4, 4) }).To(Panic())
}

// TestObjectSlotsEven: a million object keys spread over 256 slots within 8 %
// of the mean, and the slot follows the key, not the call.
func TestObjectSlotsEven(t *testing.T) {
	g := NewWithT(t)
	const count, keys = 256, 1_000_000
	per := make([]int, count)
	for i := range keys {
		per[ForObjectKey(ring.ObjectKey("example.dev", "Widget", "ns-"+strconv.Itoa(i%97), "w-"+strconv.Itoa(i)), count)]++
	}
	mean := float64(keys) / count
	g.Expect(float64(slices.Max(per)) / mean).To(BeNumerically("<=", 1.08))
	g.Expect(float64(slices.Min(per)) / mean).To(BeNumerically(">=", 0.92))
	key := ring.ObjectKey("", "ConfigMap", "default", "a")
	g.Expect(ForObjectKey(key, count)).To(Equal(ForObjectKey(key, count)))
}

// TestNamespaceSlotsMatchTheAPIServer: a namespace's slot is the API
// server's hash of it, and the shard selector of a set of slots matches an
// object exactly when its namespace's slot is in the set (the matcher is the
// API server's own).
func TestNamespaceSlotsMatchTheAPIServer(t *testing.T) {
	g := NewWithT(t)
	rnd := rand.New(rand.NewPCG(3, 4))
	for _, count := range []int{1, 3, 64, 256, 1000} {
		for range 20 {
			var set []int
			for s := range count {
				if rnd.IntN(3) == 0 {
					set = append(set, s)
				}
			}
			if len(set) == 0 {
				set = []int{rnd.IntN(count)}
			}
			sel := ShardSelector(set, count)
			for i := range 200 {
				ns := fmt.Sprintf("ns-%d-%d", rnd.Int(), i)
				if i == 0 {
					ns = "" // cluster-scoped
				}
				g.Expect(fmt.Sprintf("%016x", HashNamespace(ns))).To(Equal(sharding.HashField(ns)))
				match, err := sel.Matches(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns}})
				g.Expect(err).NotTo(HaveOccurred())
				_, in := slices.BinarySearch(set, ForNamespace(ns, count))
				g.Expect(match).To(Equal(in), "count %d namespace %q slot %d", count, ns, ForNamespace(ns, count))
			}
		}
	}
}

func TestShardSelectorString(t *testing.T) {
	g := NewWithT(t)
	g.Expect(ShardSelector([]int{0, 1, 3}, 4).String()).To(Equal(
		"shardRange(object.metadata.namespace, '0x0000000000000000', '0x8000000000000000') || " +
			"shardRange(object.metadata.namespace, '0xc000000000000000', '0x10000000000000000')"))
	g.Expect(ShardSelector([]int{1}, 3).String()).To(Equal(
		"shardRange(object.metadata.namespace, '0x5555555555555556', '0xaaaaaaaaaaaaaaab')"))
}

// TestGroups: watch groups are runs of consecutive slots, at most MaxGroups,
// their sizes differing by at most one; below MaxGroups slots each slot is
// a group.
func TestGroups(t *testing.T) {
	g := NewWithT(t)
	for _, count := range []int{1, 5, 63, 64, 65, 100, 256, 1000, 4096, 16384} {
		size := make([]int, Groups(count))
		last := 0
		for s := range count {
			group := Group(s, count)
			g.Expect(group).To(BeElementOf(last, last+1), "count %d slot %d", count, s)
			last = group
			size[group]++
		}
		g.Expect(Groups(count)).To(Equal(min(count, MaxGroups)))
		g.Expect(slices.Max(size)-slices.Min(size)).To(BeNumerically("<=", 1), "count %d", count)
		g.Expect(slices.Min(size)).To(BeNumerically(">=", 1), "count %d", count)
	}
}

// TestForMainObject: a ring's key chooses what a main object's slot comes
// from, with the ring's count (256 when unset).
func TestForMainObject(t *testing.T) {
	g := NewWithT(t)
	objects := &v1alpha1.ControllerRingSpec{Assignment: &v1alpha1.RingAssignment{Unit: v1alpha1.AssignmentUnitSlots}}
	g.Expect(ForMainObject(objects, "apps", "StatefulSet", "team-a", "db")).To(Equal(ForObjectKey("apps/StatefulSet/team-a/db", 256)))
	namespaces := &v1alpha1.ControllerRingSpec{Assignment: &v1alpha1.RingAssignment{
		Unit: v1alpha1.AssignmentUnitSlots, Slots: &v1alpha1.RingSlots{Count: 1024, Key: v1alpha1.SlotKeyNamespace},
	}}
	for _, name := range []string{"db", "cache", "web"} {
		g.Expect(ForMainObject(namespaces, "apps", "StatefulSet", "team-a", name)).To(Equal(ForNamespace("team-a", 1024)))
	}
	slot, err := ParseLabel("1023", 1024)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(slot).To(Equal(1023))
	_, err = ParseLabel("1024", 1024)
	g.Expect(err).To(HaveOccurred())
}

// TestForMainObjectByParts: the slot hashed from the key's parts is the
// slot of the key built whole (v1alpha1.ObjectKey), for keys with empty
// parts (the core group, a cluster-scoped object) and separators inside
// parts, and computing it allocates nothing.
func TestForMainObjectByParts(t *testing.T) {
	g := NewWithT(t)
	spec := &v1alpha1.ControllerRingSpec{Assignment: &v1alpha1.RingAssignment{Unit: v1alpha1.AssignmentUnitSlots,
		Slots: &v1alpha1.RingSlots{Count: 4096}}}
	rng := rand.New(rand.NewPCG(7, 11))
	parts := []string{"", "apps", "example.dev", "a/b", "ConfigMap", "team-" + strconv.Itoa(rng.IntN(100))}
	for range 2000 {
		group, kind := parts[rng.IntN(len(parts))], parts[rng.IntN(len(parts))]
		namespace, name := parts[rng.IntN(len(parts))], fmt.Sprintf("obj-%d", rng.IntN(1_000_000))
		g.Expect(ForMainObject(spec, group, kind, namespace, name)).To(
			Equal(ForObjectKey(v1alpha1.ObjectKey(group, kind, namespace, name), 4096)), "%s/%s/%s/%s", group, kind, namespace, name)
	}
	allocs := testing.AllocsPerRun(1000, func() { ForMainObject(spec, "example.dev", "EtcdCluster", "team-alpha", "cluster-production-0001") })
	g.Expect(allocs).To(BeZero(), "the slot of a main object allocates")
}
