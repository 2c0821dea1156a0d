package app

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/metadata"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
)

// Output formats of `sharder status`.
const (
	outputTable = "table"
	outputJSON  = "json"
	outputYAML  = "yaml"
)

// stateUnknownInstance marks objects labelled with an instance that has no
// Lease in the ring: they stay with nobody until the sharder moves them.
const stateUnknownInstance = "no-lease"

// listPageSize bounds each metadata list page.
const listPageSize = 500

// StatusReport is the output of `sharder status`: what the labels and
// Leases say right now, computed by the command itself (not copied from the
// rings' status, which the sharder writes only while it runs).
type StatusReport struct {
	// Time is when the Leases' states were computed.
	Time metav1.Time `json:"time"`
	// Rings are sorted by name.
	Rings []RingReport `json:"rings"`
}

// RingReport is one ring.
type RingReport struct {
	Name           string `json:"name"`
	Algorithm      string `json:"algorithm"`
	LeaseNamespace string `json:"leaseNamespace"`
	// Ready is the status of the ring's Ready condition as the sharder last
	// wrote it ("Unknown" when absent), and Reason its reason.
	Ready  string `json:"ready"`
	Reason string `json:"reason,omitempty"`
	// Instances are the ring's instance Leases, sorted by name, then the
	// instances objects are labelled with that have no Lease.
	Instances []InstanceReport `json:"instances"`
	// ReadyInstances counts instances in state ready.
	ReadyInstances int `json:"readyInstances"`
	// Objects counts main objects in the ring's namespaces.
	Objects int `json:"objects"`
	// Unassigned counts main objects without a shard label.
	Unassigned int `json:"unassigned"`
	// Drains counts main objects carrying the drain label (drains in flight).
	Drains int `json:"drains"`
	// Problems are resources that could not be read (not served, forbidden).
	Problems []string `json:"problems,omitempty"`
}

// InstanceReport is one instance of a ring.
type InstanceReport struct {
	Name string `json:"name"`
	// State is the Lease's state (ready, expired, uncertain, dead,
	// orphaned), or no-lease for an instance only labels name.
	State string `json:"state"`
	// VirtualNodes is the instance's weight (the ring's default unless its
	// Lease says otherwise).
	VirtualNodes int `json:"virtualNodes"`
	// Objects counts main objects labelled with the instance.
	Objects int `json:"objects"`
	// Controlled counts controlled objects labelled with the instance.
	Controlled int `json:"controlled"`
	// Drains counts the instance's main objects carrying the drain label.
	Drains int `json:"drains"`
	// Holder is the Lease's holder identity (empty once released).
	Holder string `json:"holder,omitempty"`
	// RenewTime is the Lease's last renewal.
	RenewTime *metav1.MicroTime `json:"renewTime,omitempty"`
	// Note explains anything odd, e.g. a malformed weight label.
	Note string `json:"note,omitempty"`
}

type statusOptions struct {
	cluster clusterFlags
	output  string
	now     func() time.Time
}

// NewStatusCommand returns `sharder status`.
func NewStatusCommand() *cobra.Command {
	o := &statusOptions{now: time.Now}
	cmd := &cobra.Command{
		Use:   "status [RING]",
		Short: "Show rings, instances, objects per instance and drains in flight",
		Long: `Show one ring, or every ring: its instances with their Lease state and weight,
the objects assigned to each instance, the drains in flight and the objects
nobody holds. The command reads ControllerRings, instance Leases and the
metadata of the rings' resources; it computes everything from the labels, so
it works whether or not the sharder is running.`,
		Example: `  sharder status
  sharder status etcd-operator
  sharder status etcd-operator -o json`,
		Args: cobra.MaximumNArgs(1),
		PreRunE: func(*cobra.Command, []string) error {
			switch o.output {
			case outputTable, outputJSON, outputYAML:
				return nil
			}
			return fmt.Errorf("--output %q: must be table, json or yaml", o.output)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.run(cmd.Context(), cmd.OutOrStdout(), args)
		},
		ValidArgsFunction: func(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
			if len(args) > 0 {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			return o.ringNames(cmd.Context()), cobra.ShellCompDirectiveNoFileComp
		},
	}
	o.cluster.addFlags(cmd.Flags())
	cmd.Flags().StringVarP(&o.output, "output", "o", outputTable, "Output format: table, json or yaml.")
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{outputTable, outputJSON, outputYAML}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

// clients returns a typed client (rings, Leases, namespaces) and a metadata
// client (the rings' resources).
func (o *statusOptions) clients() (client.Client, metadata.Interface, error) {
	cfg, err := o.cluster.restConfig()
	if err != nil {
		return nil, nil, err
	}
	c, err := client.New(cfg, client.Options{Scheme: newScheme()})
	if err != nil {
		return nil, nil, fmt.Errorf("creating client: %w", err)
	}
	m, err := metadata.NewForConfig(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("creating metadata client: %w", err)
	}
	return c, m, nil
}

func (o *statusOptions) ringNames(ctx context.Context) []string {
	c, _, err := o.clients()
	if err != nil {
		return nil
	}
	rings := &v1alpha1.ControllerRingList{}
	if err := c.List(ctx, rings); err != nil {
		return nil
	}
	names := make([]string, 0, len(rings.Items))
	for _, r := range rings.Items {
		names = append(names, r.Name)
	}
	return names
}

func (o *statusOptions) run(ctx context.Context, out io.Writer, args []string) error {
	c, m, err := o.clients()
	if err != nil {
		return err
	}
	var rings []v1alpha1.ControllerRing
	if len(args) == 1 {
		ring := &v1alpha1.ControllerRing{}
		if err := c.Get(ctx, client.ObjectKey{Name: args[0]}, ring); err != nil {
			if apierrors.IsNotFound(err) {
				return fmt.Errorf("ControllerRing %q not found (list them with: kubectl get controllerrings)", args[0])
			}
			return fmt.Errorf("reading ControllerRing %s: %w", args[0], err)
		}
		rings = append(rings, *ring)
	} else {
		list := &v1alpha1.ControllerRingList{}
		if err := c.List(ctx, list); err != nil {
			return fmt.Errorf("listing ControllerRings: %w", err)
		}
		rings = list.Items
	}
	report, err := collectStatus(ctx, c, m, rings, o.now())
	if err != nil {
		return err
	}
	return writeStatus(out, o.output, report)
}

// collectStatus computes the report of rings from their Leases and the
// labels of their resources' objects.
func collectStatus(ctx context.Context, c client.Client, m metadata.Interface, rings []v1alpha1.ControllerRing, now time.Time) (*StatusReport, error) {
	report := &StatusReport{Time: metav1.NewTime(now), Rings: []RingReport{}}
	var namespaces *corev1.NamespaceList
	for i := range rings {
		ring := &rings[i]
		r := RingReport{
			Name:           ring.Name,
			Algorithm:      ring.Spec.EffectiveAlgorithm(),
			LeaseNamespace: ring.Spec.LeaseNamespace,
			Ready:          string(metav1.ConditionUnknown),
		}
		if cond := meta.FindStatusCondition(ring.Status.Conditions, v1alpha1.ConditionReady); cond != nil {
			r.Ready, r.Reason = string(cond.Status), cond.Reason
		}
		instances, err := instancesOf(ctx, c, ring, now)
		if err != nil {
			return nil, err
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
		r.Instances = sortedInstances(instances)
		for _, inst := range r.Instances {
			if inst.State == string(membership.StateReady) {
				r.ReadyInstances++
			}
		}
		report.Rings = append(report.Rings, r)
	}
	slices.SortFunc(report.Rings, func(a, b RingReport) int { return cmp.Compare(a.Name, b.Name) })
	return report, nil
}

// instancesOf returns the ring's instances from its Leases, by name.
func instancesOf(ctx context.Context, c client.Client, ring *v1alpha1.ControllerRing, now time.Time) (map[string]*InstanceReport, error) {
	list := &coordinationv1.LeaseList{}
	if err := c.List(ctx, list, client.InNamespace(ring.Spec.LeaseNamespace), client.MatchingLabels{v1alpha1.LabelRing: ring.Name}); err != nil {
		return nil, fmt.Errorf("listing the Leases of ring %s in namespace %s: %w", ring.Name, ring.Spec.LeaseNamespace, err)
	}
	instances := make(map[string]*InstanceReport, len(list.Items))
	for i := range list.Items {
		lease := &list.Items[i]
		state, _ := membership.StateOf(lease, now)
		inst := &InstanceReport{
			Name:         lease.Name,
			State:        string(state),
			VirtualNodes: ring.Spec.EffectiveVirtualNodes(),
			Holder:       ptr.Deref(lease.Spec.HolderIdentity, ""),
			RenewTime:    lease.Spec.RenewTime,
		}
		weight, err := membership.VirtualNodesOf(lease)
		switch {
		case err != nil:
			inst.Note = err.Error() + " (the ring's default weight applies)"
		case weight > 0:
			inst.VirtualNodes = weight
		}
		instances[lease.Name] = inst
	}
	return instances, nil
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
			inst = &InstanceReport{Name: name, State: stateUnknownInstance, Note: "objects are labelled with an instance that has no Lease in the ring"}
			instances[name] = inst
		}
		return inst
	}
	seen := map[schema.GroupResource]bool{}
	for _, res := range ring.Spec.Resources {
		gr := schema.GroupResource{Group: res.Group, Resource: res.Resource}
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
				inst.Drains++
			}
		})
		if err != nil {
			r.Problems = append(r.Problems, err.Error())
		}
		for _, c := range res.ControlledResources {
			controlled := schema.GroupResource{Group: c.Group, Resource: c.Resource}
			if seen[controlled] {
				continue
			}
			seen[controlled] = true
			err := eachObject(ctx, mapper, m, controlled, "", func(obj *metav1.PartialObjectMetadata) {
				if owner := obj.Labels[shardLabel]; owner != "" && selected[obj.Namespace] {
					instance(owner).Controlled++
				}
			})
			if err != nil {
				r.Problems = append(r.Problems, err.Error())
			}
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

// sortedInstances returns the instances with a Lease by name, then those
// without one by name.
func sortedInstances(instances map[string]*InstanceReport) []InstanceReport {
	out := make([]InstanceReport, 0, len(instances))
	for _, inst := range instances {
		out = append(out, *inst)
	}
	slices.SortFunc(out, func(a, b InstanceReport) int {
		aOrphan, bOrphan := a.State == stateUnknownInstance, b.State == stateUnknownInstance
		if aOrphan != bOrphan {
			if aOrphan {
				return 1
			}
			return -1
		}
		return cmp.Compare(a.Name, b.Name)
	})
	return out
}

func writeStatus(out io.Writer, format string, report *StatusReport) error {
	switch format {
	case outputJSON:
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(report)
	case outputYAML:
		data, err := yaml.Marshal(report)
		if err != nil {
			return fmt.Errorf("encoding YAML: %w", err)
		}
		_, err = out.Write(data)
		return err
	}
	return writeStatusTable(out, report)
}

// writeStatusTable prints each ring as a header line and a table of its
// instances.
func writeStatusTable(out io.Writer, report *StatusReport) error {
	if len(report.Rings) == 0 {
		_, err := fmt.Fprintln(out, "No ControllerRings found.")
		return err
	}
	var errs []error
	for i, r := range report.Rings {
		if i > 0 {
			_, err := fmt.Fprintln(out)
			errs = append(errs, err)
		}
		ready := "Ready=" + r.Ready
		if r.Reason != "" {
			ready += " (" + r.Reason + ")"
		}
		_, err := fmt.Fprintf(out, "Ring %s: %s, %s, Leases in %s\n  %d instances (%d ready), %d objects, %d unassigned, %d drains in flight\n",
			r.Name, ready, r.Algorithm, r.LeaseNamespace,
			len(r.Instances), r.ReadyInstances, r.Objects, r.Unassigned, r.Drains)
		errs = append(errs, err)
		for _, p := range r.Problems {
			_, err := fmt.Fprintf(out, "  problem: %s\n", p)
			errs = append(errs, err)
		}
		if len(r.Instances) == 0 {
			continue
		}
		_, err = fmt.Fprintln(out)
		errs = append(errs, err)
		assigned := r.Objects - r.Unassigned
		tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		_, err = fmt.Fprintln(tw, "  INSTANCE\tSTATE\tWEIGHT\tOBJECTS\tSHARE\tCONTROLLED\tDRAINS\tNOTE")
		errs = append(errs, err)
		for _, inst := range r.Instances {
			share := "-"
			if assigned > 0 {
				share = fmt.Sprintf("%.1f%%", 100*float64(inst.Objects)/float64(assigned))
			}
			weight := "-"
			if inst.State != stateUnknownInstance {
				weight = fmt.Sprint(inst.VirtualNodes)
			}
			_, err := fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\t%s\t%d\t%d\t%s\n",
				inst.Name, inst.State, weight, inst.Objects, share, inst.Controlled, inst.Drains, oneLine(inst.Note))
			errs = append(errs, err)
		}
		errs = append(errs, tw.Flush())
	}
	return errors.Join(errs...)
}

func oneLine(s string) string { return strings.ReplaceAll(s, "\n", " ") }
