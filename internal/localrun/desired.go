package localrun

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"

	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/ring"
)

// Desired returns, for each object (namespace/name keys) of kind gk, the
// instance a ring of the given instances (default weights, default
// algorithm) assigns it to: what the sharder must converge to.
func Desired(gk schema.GroupKind, keys []string, instances []string) (map[string]string, error) {
	members := make([]ring.Member, len(instances))
	for i, id := range instances {
		members[i] = ring.Member{ID: id, VirtualNodes: sharderv1alpha1.DefaultVirtualNodes}
	}
	r, err := ring.New(sharderv1alpha1.DefaultAlgorithm, members)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(keys))
	for _, k := range keys {
		ns, name, _ := strings.Cut(k, "/")
		id, err := r.Lookup(ring.ObjectKey(gk.Group, gk.Kind, ns, name))
		if err != nil {
			return nil, fmt.Errorf("looking up %s: %w", k, err)
		}
		out[k] = id
	}
	return out, nil
}

// SettledOn is a Tracker.Wait condition: n objects of kind gk, each on the
// instance the ring of instances chooses for it, none draining.
func SettledOn(gk schema.GroupKind, n int, instances ...string) func([]Tracked) error {
	return func(objs []Tracked) error {
		if n >= 0 && len(objs) != n {
			return fmt.Errorf("%d objects tracked, want %d", len(objs), n)
		}
		keys := make([]string, len(objs))
		for i, o := range objs {
			keys[i] = o.Key
		}
		want, err := Desired(gk, keys, instances)
		if err != nil {
			return err
		}
		var wrong []string
		for _, o := range objs {
			if o.Draining || o.Instance != want[o.Key] {
				wrong = append(wrong, fmt.Sprintf("%s on %q (draining %t), want %s", o.Key, o.Instance, o.Draining, want[o.Key]))
			}
		}
		if len(wrong) > 0 {
			n := len(wrong)
			if n > 3 {
				wrong = wrong[:3]
			}
			return fmt.Errorf("%d of %d objects not on their instance among %v: %s", n, len(objs), instances, strings.Join(wrong, "; "))
		}
		return nil
	}
}
