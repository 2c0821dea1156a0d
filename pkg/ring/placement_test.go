package ring_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"

	"github.com/sharder-dev/sharder/pkg/ring"
	"github.com/sharder-dev/sharder/pkg/sharder/simulation"
)

// A ring's placement must not change between versions of the sharder: every
// object whose owner changes is moved. These digests pin where each built-in
// places a fixed set of keys on a fixed membership; a change that breaks one
// of them moves the objects of every ring using that algorithm, and needs a
// new algorithm name instead.
func TestPlacementIsPinned(t *testing.T) {
	want := map[string]string{
		ring.ConsistentHash:      "6ee06a0dbb4072db",
		ring.ConsistentHashDense: "742c3b6a3c11eba4",
		ring.Rendezvous:          "8d21600307edd78b",
		ring.HashMod:             "54ace2fcf59a0f06",
		ring.Range:               "1f18b12c5d331585",
	}
	keys := simulation.Keys(5000, 21)
	ms := []ring.Member{
		{ID: "web-0", VirtualNodes: 512},
		{ID: "web-1", VirtualNodes: 512},
		{ID: "web-2", VirtualNodes: 256},
		{ID: "web-3", VirtualNodes: 1024},
		{ID: "etcd-operator-7d9f8b6c5d-x2x4q", VirtualNodes: 512},
		{ID: "op-1", VirtualNodes: 100},
		{ID: "op-12", VirtualNodes: 100},
	}
	for _, alg := range builtins {
		t.Run(alg, func(t *testing.T) {
			owners := lookupAll(t, mustNew(t, alg, ms), keys)
			got := fmt.Sprintf("%016x", xxhash.Sum64String(strings.Join(owners, "\n")))
			if got != want[alg] {
				t.Errorf("placement digest = %s, want %s: the algorithm places keys differently", got, want[alg])
			}
		})
	}
}
