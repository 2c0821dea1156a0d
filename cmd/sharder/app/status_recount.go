package app

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/metadata"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// listPageSize bounds each metadata list page.
const listPageSize = 500

// recountStatus makes the report of rings from their Leases and the labels
// of their resources' objects.
func recountStatus(ctx context.Context, c client.Client, m metadata.Interface, rings []v1alpha1.ControllerRing, now time.Time) (*StatusReport, error) {
	report := &StatusReport{Time: metav1.NewTime(now), Rings: []RingReport{}}
	var namespaces *corev1.NamespaceList
	for i := range rings {
		ring := &rings[i]
		r := newRingReport(ring, sourceLabels)
		leases, err := leasesOf(ctx, c, ring)
		if err != nil {
			return nil, err
		}
		instances := make(map[string]*InstanceReport, len(leases))
		for i := range leases {
			inst := leaseInstance(ring, &leases[i], now)
			inst.Controlled, inst.Drains = new(int), new(int)
			instances[inst.Name] = inst
		}
		if namespaces == nil {
			namespaces = &corev1.NamespaceList{}
			if err := c.List(ctx, namespaces); err != nil {
				return nil, fmt.Errorf("listing namespaces: %w", err)
			}
		}
		selected, err := selectedNamespaces(ring, namespaces)
		if err != nil {
			r.Problems = append(r.Problems, err.Error())
		} else {
			countObjects(ctx, c.RESTMapper(), m, ring, selected, instances, &r)
		}
		addSlots(ring, &r, instances)
		r.Instances = sortedInstances(instances)
		r.ReadyInstances = countReady(r.Instances)
		for _, inst := range r.Instances {
			if inst.State == stateUnknownInstance {
				r.ObjectsWithoutLease += inst.Objects
			}
		}
		report.Rings = append(report.Rings, r)
	}
	slices.SortFunc(report.Rings, func(a, b RingReport) int { return cmp.Compare(a.Name, b.Name) })
	return report, nil
}

// selectedNamespaces returns the names of the namespaces whose objects the
// ring shards.
func selectedNamespaces(ring *v1alpha1.ControllerRing, namespaces *corev1.NamespaceList) (map[string]bool, error) {
	sel, err := ring.Spec.NamespaceLabelSelector()
	if err != nil {
		return nil, err
	}
	selected := map[string]bool{}
	for _, ns := range namespaces.Items {
		if sel.Matches(labels.Set(ns.Labels)) {
			selected[ns.Name] = true
		}
	}
	return selected, nil
}

// countObjects lists the metadata of the ring's main and controlled
// resources and counts them into r and instances. A resource that cannot be
// listed becomes a problem of the ring; the others are still counted.
func countObjects(ctx context.Context, mapper meta.RESTMapper, m metadata.Interface, ring *v1alpha1.ControllerRing, selected map[string]bool, instances map[string]*InstanceReport, r *RingReport) {
	shardLabel, drainLabel := v1alpha1.ShardLabel(ring.Name), v1alpha1.DrainLabel(ring.Name)
	instance := func(name string) *InstanceReport {
		inst, ok := instances[name]
		if !ok {
			inst = &InstanceReport{Name: name, State: stateUnknownInstance, Controlled: new(int), Drains: new(int),
				Note: "objects are labelled with an instance that has no Lease in the ring"}
			instances[name] = inst
		}
		return inst
	}
	for _, gr := range ring.Spec.MainResources() {
		err := eachObject(ctx, mapper, m, gr, "", func(obj *metav1.PartialObjectMetadata) {
			if !selected[obj.Namespace] {
				return
			}
			r.Objects++
			owner, assigned := obj.Labels[shardLabel]
			_, draining := obj.Labels[drainLabel]
			if draining {
				r.Drains++
			}
			if !assigned || owner == "" {
				r.Unassigned++
				return
			}
			inst := instance(owner)
			inst.Objects++
			if draining {
				*inst.Drains++
			}
		})
		if err != nil {
			r.Problems = append(r.Problems, err.Error())
		}
	}
	for _, gr := range ring.Spec.ControlledResources() {
		err := eachObject(ctx, mapper, m, gr, "", func(obj *metav1.PartialObjectMetadata) {
			if owner := obj.Labels[shardLabel]; owner != "" && selected[obj.Namespace] {
				*instance(owner).Controlled++
			}
		})
		if err != nil {
			r.Problems = append(r.Problems, err.Error())
		}
	}
}

// eachObject calls fn with the metadata of every object of gr that matches
// the label selector (all with ""), page by page.
func eachObject(ctx context.Context, mapper meta.RESTMapper, m metadata.Interface, gr schema.GroupResource, selector string,
	fn func(*metav1.PartialObjectMetadata)) error {
	gvr, err := mapper.ResourceFor(gr.WithVersion(""))
	if err != nil {
		return fmt.Errorf("resource %s: not served by the API server: %w", gr, err)
	}
	opts := metav1.ListOptions{Limit: listPageSize, LabelSelector: selector}
	for {
		list, err := m.Resource(gvr).List(ctx, opts)
		if err != nil {
			return fmt.Errorf("listing %s: %w", gr, err)
		}
		for i := range list.Items {
			fn(&list.Items[i])
		}
		if list.Continue == "" {
			return nil
		}
		opts.Continue = list.Continue
	}
}
