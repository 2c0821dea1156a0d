package simulation

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// alphabet of the random parts of generated names: the one Kubernetes uses
// for generateName suffixes (no vowels, no easily confused characters).
const alphabet = "bcdfghjklmnpqrstvwxz2456789"

func randomString(rng *rand.Rand, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[rng.IntN(len(alphabet))]
	}
	return string(b)
}

// InstanceNames returns n distinct instance IDs in style, deterministic for
// rng's seed.
func InstanceNames(style NameStyle, prefix string, n int, rng *rand.Rand) []string {
	names := make([]string, 0, n)
	if style == StatefulSet {
		for i := range n {
			names = append(names, prefix+"-"+strconv.Itoa(i))
		}
		return names
	}
	template := randomString(rng, 10) // one ReplicaSet's pod-template hash
	seen := map[string]bool{}
	for len(names) < n {
		name := fmt.Sprintf("%s-%s-%s", prefix, template, randomString(rng, 5))
		if !seen[name] {
			seen[name] = true
			names = append(names, name)
		}
	}
	return names
}

// Keys returns n distinct hash keys of main objects, shaped like the keys of
// namespaced objects with generated names, deterministic for seed.
func Keys(n int, seed uint64) []string {
	rng := rand.New(rand.NewPCG(seed, 0x6b657973)) //nolint:gosec // reproducible from the seed on purpose
	keys := make([]string, 0, n)
	// Keys are told apart by their 64-bit hashes, which keeps millions of
	// keys affordable; two distinct keys of one hash (never seen) would
	// drop the second, the same way for every run.
	seen := make(map[uint64]struct{}, n)
	for len(keys) < n {
		key := "example.dev/Widget/namespace-" + strconv.Itoa(rng.IntN(50)) + "/widget-" + randomString(rng, 8)
		if h := xxhash.Sum64String(key); !has(seen, h) {
			seen[h] = struct{}{}
			keys = append(keys, key)
		}
	}
	return keys
}

func has(set map[uint64]struct{}, h uint64) bool {
	_, ok := set[h]
	return ok
}

// compareIDs orders instance IDs with numeric suffixes by number, so that
// instance-2 comes before instance-10 in reports.
func compareIDs(a, b string) int {
	ai, bi := strings.LastIndexByte(a, '-'), strings.LastIndexByte(b, '-')
	if ai >= 0 && bi >= 0 && a[:ai] == b[:bi] {
		an, aerr := strconv.Atoi(a[ai+1:])
		bn, berr := strconv.Atoi(b[bi+1:])
		if aerr == nil && berr == nil {
			return an - bn
		}
	}
	return strings.Compare(a, b)
}
