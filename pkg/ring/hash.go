package ring

import (
	"github.com/cespare/xxhash/v2"
)

// hashKey is the hash every built-in algorithm applies to a key: the 64-bit
// xxHash of its bytes. It is part of the placement: changing it moves keys.
func hashKey(key string) uint64 { return xxhash.Sum64String(key) }

// xxHasher is the consistent.Hasher of the consistent-hash algorithm.
type xxHasher struct{}

func (xxHasher) Sum64(b []byte) uint64 { return xxhash.Sum64(b) }

// mix64 is a bijective finalizer (from MurmurHash3) that spreads the bits of
// x over the whole word; rendezvous hashing combines a key hash and a member
// hash with it.
func mix64(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}
