package ring_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/sharder-dev/sharder/pkg/ring"
)

func TestObjectKey(t *testing.T) {
	for _, tc := range []struct {
		group, kind, namespace, name, want string
	}{
		{"etcd.example.dev", "EtcdCluster", "prod", "main", "etcd.example.dev/EtcdCluster/prod/main"},
		{"", "ConfigMap", "default", "settings", "/ConfigMap/default/settings"},
		{"example.dev", "Widget", "", "cluster-wide", "example.dev/Widget//cluster-wide"},
	} {
		if got := ring.ObjectKey(tc.group, tc.kind, tc.namespace, tc.name); got != tc.want {
			t.Errorf("ObjectKey(%q, %q, %q, %q) = %q, want %q", tc.group, tc.kind, tc.namespace, tc.name, got, tc.want)
		}
	}
}

// objectParts are main objects' key parts, with empty groups and
// namespaces, and parts that contain the separator.
func objectParts(n int) [][4]string {
	rng := rand.New(rand.NewPCG(1, 2))
	groups := []string{"", "apps", "sharder.dev", "a/b"}
	kinds := []string{"ConfigMap", "Deployment", "EtcdCluster"}
	namespaces := []string{"", "default", "team-a", "x/y"}
	out := make([][4]string, n)
	for i := range out {
		out[i] = [4]string{groups[rng.IntN(len(groups))], kinds[rng.IntN(len(kinds))], namespaces[rng.IntN(len(namespaces))], fmt.Sprintf("object-%d", rng.Uint32())}
	}
	return out
}

// Every built-in ring, of every size, places an object by its parts where
// it places the object's key: LookupObject is Lookup of ObjectKey.
func TestLookupObjectIsLookupOfObjectKey(t *testing.T) {
	parts := objectParts(5000)
	for _, algorithm := range builtins {
		for _, ms := range [][]ring.Member{nil, members("instance", 1, 0), members("instance", 3, 0), members("instance", 40, 0),
			{{ID: "light", VirtualNodes: 10}, {ID: "heavy", VirtualNodes: 400}, {ID: "middle", VirtualNodes: 100}}} {
			r := mustNew(t, algorithm, ms)
			if _, ok := r.(ring.HashRing); !ok {
				t.Errorf("%s with %d members: %T is not a HashRing", algorithm, len(ms), r)
			}
			for _, p := range parts {
				want, wantErr := r.Lookup(ring.ObjectKey(p[0], p[1], p[2], p[3]))
				got, err := ring.LookupObject(r, p[0], p[1], p[2], p[3])
				if got != want || !errors.Is(err, wantErr) {
					t.Fatalf("%s with %d members, %q: LookupObject = %q, %v; Lookup(ObjectKey) = %q, %v", algorithm, len(ms), p, got, err, want, wantErr)
				}
			}
		}
	}
}

// keyRing is a Ring that looks keys up only by the key itself: it records
// the keys it was asked for.
type keyRing struct{ keys []string }

func (r *keyRing) Lookup(key string) (string, error) {
	r.keys = append(r.keys, key)
	return "instance-0", nil
}

func (r *keyRing) Members() []ring.Member { return []ring.Member{{ID: "instance-0"}} }

// A ring that is no HashRing is asked for the object's key.
func TestLookupObjectOtherRings(t *testing.T) {
	r := &keyRing{}
	got, err := ring.LookupObject(r, "apps", "Deployment", "default", "web")
	if err != nil || got != "instance-0" {
		t.Fatalf("LookupObject = %q, %v", got, err)
	}
	if len(r.keys) != 1 || r.keys[0] != "apps/Deployment/default/web" {
		t.Fatalf("keys looked up: %q, want the object's key", r.keys)
	}
}

// BenchmarkLookupObject compares a lookup by the object's parts with one of
// the key built from them (allocations included).
func BenchmarkLookupObject(b *testing.B) {
	parts := objectParts(4096)
	r := mustNew(b, ring.ConsistentHash, members("instance", 10, 0))
	b.Run("parts", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			p := parts[i&4095]
			if _, err := ring.LookupObject(r, p[0], p[1], p[2], p[3]); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("key", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			p := parts[i&4095]
			if _, err := r.Lookup(ring.ObjectKey(p[0], p[1], p[2], p[3])); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}

// Every built-in ring looks an object up by its parts without allocating:
// the sharder does it for every object it decides and every admission.
func TestLookupObjectAllocatesNothing(t *testing.T) {
	for _, algorithm := range builtins {
		r := mustNew(t, algorithm, members("instance", 40, 0))
		allocs := testing.AllocsPerRun(1000, func() {
			_, _ = ring.LookupObject(r, "example.dev", "EtcdCluster", "team-alpha", "cluster-production-0001")
		})
		if allocs != 0 {
			t.Errorf("%s: LookupObject allocates %.1f times per object", algorithm, allocs)
		}
	}
}
