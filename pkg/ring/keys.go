package ring

import (
	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// ObjectKey returns the hash key of a main object, v1alpha1.ObjectKey:
// "<group>/<Kind>/<namespace>/<name>", with an empty group for the core API
// group and an empty namespace for cluster-scoped objects.
func ObjectKey(group, kind, namespace, name string) string {
	return v1alpha1.ObjectKey(group, kind, namespace, name)
}

// HashRing is a Ring that also looks a key up by its hash, the 64-bit xxHash
// of its bytes that every built-in algorithm applies: LookupHash(h) returns
// what Lookup returns for a key of hash h. Every ring the built-in
// algorithms build is one.
type HashRing interface {
	Ring
	LookupHash(h uint64) (string, error)
}

var (
	_ HashRing = (*partitionRing)(nil)
	_ HashRing = (*denseRing)(nil)
	_ HashRing = (*rendezvousRing)(nil)
	_ HashRing = rangeRing{}
	_ HashRing = hashModRing{}
	_ HashRing = singleRing{}
	_ HashRing = emptyRing{}
)

// LookupObject returns what r.Lookup(ObjectKey(group, kind, namespace,
// name)) returns. For a HashRing it hashes the key's parts one after the
// other (v1alpha1.ObjectKeyHash) instead of building the key: a pass over
// a million objects then allocates nothing per object.
func LookupObject(r Ring, group, kind, namespace, name string) (string, error) {
	hr, ok := r.(HashRing)
	if !ok {
		return r.Lookup(ObjectKey(group, kind, namespace, name))
	}
	return hr.LookupHash(v1alpha1.ObjectKeyHash(group, kind, namespace, name))
}
