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
	d, err := newDesired(gk, instances)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(keys))
	for _, k := range keys {
		if out[k], err = d.instance(k); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// desired looks objects up in a ring of fixed instances, remembering each
// answer: a Wait condition checked many times builds its ring once and
// hashes each object once.
type desired struct {
	gk     schema.GroupKind
	ring   ring.Ring
	lookup map[string]string
}

func newDesired(gk schema.GroupKind, instances []string) (*desired, error) {
	members := make([]ring.Member, len(instances))
	for i, id := range instances {
		members[i] = ring.Member{ID: id, VirtualNodes: sharderv1alpha1.DefaultVirtualNodes}
	}
	r, err := ring.New(sharderv1alpha1.DefaultAlgorithm, members)
	if err != nil {
		return nil, err
	}
	return &desired{gk: gk, ring: r, lookup: map[string]string{}}, nil
}

// instance returns the instance of the object with the key namespace/name.
func (d *desired) instance(key string) (string, error) {
	if id, ok := d.lookup[key]; ok {
		return id, nil
	}
	ns, name, _ := strings.Cut(key, "/")
	id, err := d.ring.Lookup(ring.ObjectKey(d.gk.Group, d.gk.Kind, ns, name))
	if err != nil {
		return "", fmt.Errorf("looking up %s: %w", key, err)
	}
	d.lookup[key] = id
	return id, nil
}

// SettledOn is a LabelWatch.Wait condition: n objects of kind gk, each on the
// instance the ring of instances chooses for it, none draining.
func SettledOn(gk schema.GroupKind, n int, instances ...string) func([]Watched) error {
	var d *desired
	return func(objs []Watched) error {
		if n >= 0 && len(objs) != n {
			return fmt.Errorf("%d objects tracked, want %d", len(objs), n)
		}
		if d == nil {
			var err error
			if d, err = newDesired(gk, instances); err != nil {
				return err
			}
		}
		var wrong []string
		count := 0
		for _, o := range objs {
			want, err := d.instance(o.Key)
			if err != nil {
				return err
			}
			if o.Draining || o.Instance != want {
				if count++; len(wrong) < 3 {
					wrong = append(wrong, fmt.Sprintf("%s on %q (draining %t), want %s", o.Key, o.Instance, o.Draining, want))
				}
			}
		}
		if count > 0 {
			return fmt.Errorf("%d of %d objects not on their instance among %v: %s", count, len(objs), instances, strings.Join(wrong, "; "))
		}
		return nil
	}
}
