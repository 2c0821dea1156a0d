package app

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/metadata"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/drain"
)

// DrainReport is one drain in flight: a main object carrying the ring's
// drain label (--drains).
type DrainReport struct {
	Resource  string `json:"resource"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
	// Instance is the instance the object is assigned to (its shard
	// label); empty once the sharder released the object in a forced move.
	Instance string `json:"instance,omitempty"`
	// Target is the instance the drain label names; empty when it names
	// none (the value "true", or any value that is not an instance ID).
	Target string `json:"target,omitempty"`
	// Started is when the sharder requested the drain, as it recorded it on
	// the object (the annotation drain-started.sharder.dev/<ring>), by its
	// own clock: a newly elected leader counts the drain's timeout from it.
	// Absent when the sharder that requested the drain recorded no start.
	Started *metav1.Time `json:"started,omitempty"`
	// Labelled is when the drain label was last written, as the API server
	// recorded it in the object's managedFields: the last time the field
	// manager owning the label changed a field of the object. Absent when
	// the object records no owner of the label.
	Labelled *metav1.Time `json:"labelled,omitempty"`
	// Manager is the field manager owning the drain label.
	Manager string `json:"manager,omitempty"`
}

// UnassignedReport is an object of the ring's resources without the ring's
// shard label (--unassigned).
type UnassignedReport struct {
	Resource  string      `json:"resource"`
	Namespace string      `json:"namespace,omitempty"`
	Name      string      `json:"name"`
	Created   metav1.Time `json:"created"`
	// Controller is the controller a controlled object follows
	// ("<Kind>.<group> <name>"); empty for a main object.
	Controller string `json:"controller,omitempty"`
	// Released says the object still carries the drain label: the sharder
	// removed its shard label in a forced move and assigns it to the
	// instance the drain named after the release grace.
	Released bool `json:"released,omitempty"`
}

// listRingObjects adds to each ring of report its drains in flight
// (drains) and its unassigned objects (unassigned), listed from the labels
// of its resources' objects in its namespaces. A resource that cannot be
// listed becomes a problem of the ring.
func listRingObjects(ctx context.Context, c client.Client, m metadata.Interface, rings []v1alpha1.ControllerRing,
	report *StatusReport, drains, unassigned bool) error {
	byName := make(map[string]*v1alpha1.ControllerRing, len(rings))
	for i := range rings {
		byName[rings[i].Name] = &rings[i]
	}
	namespaces := &corev1.NamespaceList{}
	if err := c.List(ctx, namespaces); err != nil {
		return fmt.Errorf("listing namespaces: %w", err)
	}
	for i := range report.Rings {
		r := &report.Rings[i]
		ring := byName[r.Name]
		selected, err := selectedNamespaces(ring, namespaces)
		if err != nil {
			r.Problems = append(r.Problems, err.Error())
			continue
		}
		if drains {
			r.DrainList = listDrains(ctx, c.RESTMapper(), m, ring, selected, r)
		}
		if unassigned {
			r.UnassignedList = listUnassigned(ctx, c.RESTMapper(), m, ring, selected, r)
		}
	}
	return nil
}

// listDrains returns the ring's main objects carrying its drain label.
func listDrains(ctx context.Context, mapper meta.RESTMapper, m metadata.Interface, ring *v1alpha1.ControllerRing,
	selected map[string]bool, r *RingReport) []DrainReport {
	shardLabel, drainLabel := v1alpha1.ShardLabel(ring.Name), v1alpha1.DrainLabel(ring.Name)
	out := []DrainReport{}
	for _, gr := range ring.Spec.MainResources() {
		err := eachObject(ctx, mapper, m, gr, drainLabel, func(obj *metav1.PartialObjectMetadata) {
			if !selected[obj.Namespace] {
				return
			}
			d := DrainReport{Resource: gr.String(), Namespace: obj.Namespace, Name: obj.Name, Instance: obj.Labels[shardLabel]}
			if target := obj.Labels[drainLabel]; drain.IsTarget(target) {
				d.Target = target
			}
			if started, ok := drain.Started(obj, ring.Name); ok {
				d.Started = &metav1.Time{Time: started}
			}
			d.Manager, d.Labelled = labelWriter(obj.ManagedFields, drainLabel)
			out = append(out, d)
		})
		if err != nil {
			r.Problems = append(r.Problems, err.Error())
		}
	}
	slices.SortFunc(out, func(a, b DrainReport) int {
		return cmp.Or(cmp.Compare(a.Resource, b.Resource), cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return out
}

// listUnassigned returns the ring's main objects without its shard label,
// and its controlled objects without it whose controller is of one of the
// ring's resources (the others are not the ring's to assign).
func listUnassigned(ctx context.Context, mapper meta.RESTMapper, m metadata.Interface, ring *v1alpha1.ControllerRing,
	selected map[string]bool, r *RingReport) []UnassignedReport {
	shardLabel, drainLabel := v1alpha1.ShardLabel(ring.Name), v1alpha1.DrainLabel(ring.Name)
	selector := "!" + shardLabel
	kinds := ringKinds(mapper, ring)
	out := []UnassignedReport{}
	add := func(gr schema.GroupResource, main bool) {
		err := eachObject(ctx, mapper, m, gr, selector, func(obj *metav1.PartialObjectMetadata) {
			if !selected[obj.Namespace] {
				return
			}
			u := UnassignedReport{Resource: gr.String(), Namespace: obj.Namespace, Name: obj.Name, Created: obj.CreationTimestamp}
			if main {
				_, u.Released = obj.Labels[drainLabel]
			} else {
				owner := metav1.GetControllerOfNoCopy(obj)
				if owner == nil {
					return
				}
				gv, err := schema.ParseGroupVersion(owner.APIVersion)
				gk := schema.GroupKind{Group: gv.Group, Kind: owner.Kind}
				if err != nil || !kinds[gk] {
					return
				}
				u.Controller = gk.String() + " " + owner.Name
			}
			out = append(out, u)
		})
		if err != nil {
			r.Problems = append(r.Problems, err.Error())
		}
	}
	for _, gr := range ring.Spec.MainResources() {
		add(gr, true)
	}
	for _, gr := range ring.Spec.ControlledResources() {
		add(gr, false)
	}
	slices.SortFunc(out, func(a, b UnassignedReport) int {
		return cmp.Or(cmp.Compare(a.Resource, b.Resource), cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return out
}

// ringKinds returns the kinds of the ring's main and controlled resources
// that the API server serves.
func ringKinds(mapper meta.RESTMapper, ring *v1alpha1.ControllerRing) map[schema.GroupKind]bool {
	kinds := map[schema.GroupKind]bool{}
	for _, gr := range append(ring.Spec.MainResources(), ring.Spec.ControlledResources()...) {
		if gvk, err := mapper.KindFor(gr.WithVersion("")); err == nil {
			kinds[gvk.GroupKind()] = true
		}
	}
	return kinds
}

// labelWriter returns the field manager that owns label in managed and when
// it last changed a field of the object ("" and nil when no entry owns
// it). Label writes by update or patch make the writer own the label, and
// the API server stamps the entry with the time of every change it makes.
func labelWriter(managed []metav1.ManagedFieldsEntry, label string) (string, *metav1.Time) {
	var manager string
	var at *metav1.Time
	for _, e := range managed {
		if e.FieldsV1 == nil || e.Time == nil || !ownsLabel(e.FieldsV1.GetRawBytes(), label) {
			continue
		}
		if at == nil || e.Time.After(at.Time) {
			manager, at = e.Manager, e.Time
		}
	}
	return manager, at
}

// ownsLabel says whether the fieldsV1 set fields holds the label.
func ownsLabel(fields []byte, label string) bool {
	var set struct {
		Metadata struct {
			Labels map[string]json.RawMessage `json:"f:labels"`
		} `json:"f:metadata"`
	}
	if err := json.Unmarshal(fields, &set); err != nil {
		return false
	}
	_, ok := set.Metadata.Labels["f:"+label]
	return ok
}
