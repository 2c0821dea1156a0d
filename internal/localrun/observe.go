package localrun

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/drain"
)

// ObjectState is what a ring's labels say about one object.
type ObjectState struct {
	// Key is namespace/name.
	Key string
	// Instance is the value of the shard label ("" when unassigned).
	Instance string
	// Draining is true when the drain label is set.
	Draining bool
	// Generation of the object.
	Generation int64
}

// Assignment is the state of every object of one resource in a ring.
type Assignment []ObjectState

// ListAssignment lists the metadata of every object of gvk in namespace
// ("" for all) and reads the ring's labels.
func ListAssignment(ctx context.Context, c client.Reader, gvk schema.GroupVersionKind, namespace, ring string) (Assignment, error) {
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
	var opts []client.ListOption
	if namespace != "" {
		opts = append(opts, client.InNamespace(namespace))
	}
	if err := c.List(ctx, list, opts...); err != nil {
		return nil, fmt.Errorf("listing %s: %w", gvk.Kind, err)
	}
	a := make(Assignment, 0, len(list.Items))
	for i := range list.Items {
		o := &list.Items[i]
		labels := o.GetLabels()
		a = append(a, ObjectState{
			Key:        o.GetNamespace() + "/" + o.GetName(),
			Instance:   labels[sharderv1alpha1.ShardLabel(ring)],
			Draining:   drain.Requested(o, ring),
			Generation: o.GetGeneration(),
		})
	}
	sort.Slice(a, func(i, j int) bool { return a[i].Key < a[j].Key })
	return a, nil
}

// ByKey returns the assignment as a map from object key to instance.
func (a Assignment) ByKey() map[string]string {
	m := make(map[string]string, len(a))
	for _, o := range a {
		m[o.Key] = o.Instance
	}
	return m
}

// Counts returns the number of objects per instance ("" = unassigned).
func (a Assignment) Counts() map[string]int {
	m := map[string]int{}
	for _, o := range a {
		m[o.Instance]++
	}
	return m
}

// Settled returns nil when every object is assigned to one of instances
// (to any instance when none is given) and none is draining; otherwise an
// error describing the first few exceptions.
func (a Assignment) Settled(instances ...string) error {
	allowed := map[string]bool{}
	for _, i := range instances {
		allowed[i] = true
	}
	var bad []string
	for _, o := range a {
		switch {
		case o.Instance == "":
			bad = append(bad, o.Key+" unassigned")
		case len(allowed) > 0 && !allowed[o.Instance]:
			bad = append(bad, o.Key+" on "+o.Instance)
		case o.Draining:
			bad = append(bad, o.Key+" draining")
		}
	}
	if len(bad) == 0 {
		return nil
	}
	n := len(bad)
	if len(bad) > 5 {
		bad = bad[:5]
	}
	return fmt.Errorf("%d of %d objects not settled on %v: %s", n, len(a), instances, strings.Join(bad, ", "))
}

// FormatCounts renders per-instance counts in instance order.
func FormatCounts(counts map[string]int) string {
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		name := k
		if name == "" {
			name = "(unassigned)"
		}
		fmt.Fprintf(&b, "  %-24s %d\n", name, counts[k])
	}
	return b.String()
}

// Moved counts the objects whose instance differs between two assignments
// (objects present in both).
func Moved(before, after Assignment) int {
	b := before.ByKey()
	n := 0
	for _, o := range after {
		if prev, ok := b[o.Key]; ok && prev != o.Instance {
			n++
		}
	}
	return n
}

// LeaseState is an instance Lease as the sharder and people see it.
type LeaseState struct {
	Name         string
	Holder       string
	State        string
	RenewTime    time.Time
	DurationSecs int32
}

// ListLeases returns the instance Leases of ring in namespace.
func ListLeases(ctx context.Context, c client.Reader, namespace, ring string) ([]LeaseState, error) {
	list := &coordinationv1.LeaseList{}
	if err := c.List(ctx, list, client.InNamespace(namespace), client.MatchingLabels{sharderv1alpha1.LabelRing: ring}); err != nil {
		return nil, fmt.Errorf("listing Leases of ring %s: %w", ring, err)
	}
	out := make([]LeaseState, 0, len(list.Items))
	for _, l := range list.Items {
		s := LeaseState{Name: l.Name, State: l.Labels[sharderv1alpha1.LabelState]}
		if l.Spec.HolderIdentity != nil {
			s.Holder = *l.Spec.HolderIdentity
		}
		if l.Spec.RenewTime != nil {
			s.RenewTime = l.Spec.RenewTime.Time
		}
		if l.Spec.LeaseDurationSeconds != nil {
			s.DurationSecs = *l.Spec.LeaseDurationSeconds
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Poll calls fn every interval until it succeeds, timeout passes (it then
// returns fn's last error) or ctx ends. It is for programs outside tests
// (demo, bench); tests use gomega's Eventually.
func Poll(ctx context.Context, timeout, interval time.Duration, fn func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := fn()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(interval):
		}
	}
}
