package ring_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/sharder-dev/sharder/pkg/ring"
)

// FuzzBuild builds rings of arbitrary memberships (IDs split from a string,
// weights from bytes) with every built-in, in two orders, and checks that
// nothing panics, that both orders agree, and that every key lands on a
// member.
func FuzzBuild(f *testing.F) {
	f.Add("op-0,op-1,op-2", []byte{128, 128, 128}, "g/Kind/ns/name")
	f.Add("op-1,op-12", []byte{20, 0}, "")
	f.Add("a,a,a", []byte{0, 255, 3}, "key")
	f.Add("", []byte{}, "x")
	f.Add(",,", []byte{1}, "x")
	f.Add("op-1\x00,op-1", []byte{255, 255}, "\xff\xfe")
	f.Fuzz(func(t *testing.T, ids string, weights []byte, key string) {
		var ms []ring.Member
		for i, id := range strings.Split(ids, ",") {
			w := -1
			if i < len(weights) {
				w = int(weights[i]) - 8 // below 1 up to 247; huge weights: TestLargeMemberships
			}
			ms = append(ms, ring.Member{ID: id, VirtualNodes: w})
		}
		if len(ms) > 16 {
			ms = ms[:16] // keeps builds fast enough to fuzz
		}
		reversed := slices.Clone(ms)
		slices.Reverse(reversed)
		for _, alg := range builtins {
			r1, err1 := ring.New(alg, ms)
			r2, err2 := ring.New(alg, reversed)
			if (err1 == nil) != (err2 == nil) {
				t.Fatalf("%s: order changes the outcome: %v vs %v", alg, err1, err2)
			}
			if err1 != nil {
				if !errors.Is(err1, ring.ErrInvalidMember) {
					t.Fatalf("%s: unexpected error %v", alg, err1)
				}
				continue
			}
			o1, e1 := r1.Lookup(key)
			o2, e2 := r2.Lookup(key)
			if o1 != o2 || (e1 == nil) != (e2 == nil) {
				t.Fatalf("%s: order changes the owner of %q: %q/%v vs %q/%v", alg, key, o1, e1, o2, e2)
			}
			if e1 != nil {
				if !errors.Is(e1, ring.ErrNoInstance) || len(r1.Members()) != 0 {
					t.Fatalf("%s: Lookup error %v with %d members", alg, e1, len(r1.Members()))
				}
				continue
			}
			if !slices.ContainsFunc(r1.Members(), func(m ring.Member) bool { return m.ID == o1 }) {
				t.Fatalf("%s: key %q placed on non-member %q", alg, key, o1)
			}
		}
	})
}
