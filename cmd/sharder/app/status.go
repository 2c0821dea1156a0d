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
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/transport"
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

// Where a ring's counts come from (RingReport.Source).
const (
	// sourceStatus: the ring's status, as the sharder last wrote it.
	sourceStatus = "status"
	// sourceLabels: counted by the command from the objects' labels
	// (--recount).
	sourceLabels = "labels"
)

// stateUnknownInstance marks objects labelled with an instance that has no
// Lease in the ring: they stay with nobody until the sharder moves them.
const stateUnknownInstance = "no-lease"

// listPageSize bounds each metadata list page.
const listPageSize = 500

// StatusReport is the output of `sharder status`.
type StatusReport struct {
	// Time is when the report was made: Lease ages, and the states the
	// command computes itself, are relative to it.
	Time metav1.Time `json:"time"`
	// Rings are sorted by name.
	Rings []RingReport `json:"rings"`
}

// RingReport is one ring.
type RingReport struct {
	Name           string `json:"name"`
	Algorithm      string `json:"algorithm"`
	LeaseNamespace string `json:"leaseNamespace"`
	// Source says where the counts and states come from: "status" (the
	// ring's status as the sharder last wrote it) or "labels" (counted from
	// the objects' labels and the Leases by the command, with --recount).
	Source string `json:"source"`
	// Generation is the ring's metadata.generation, ObservedGeneration the
	// generation its status describes (0: no status written yet).
	Generation         int64 `json:"generation"`
	ObservedGeneration int64 `json:"observedGeneration"`
	// Ready is the status of the ring's Ready condition as the sharder last
	// wrote it ("Unknown" when absent), Reason and Message its reason and
	// message.
	Ready   string `json:"ready"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// Stale lists why the ring's status may be out of date (source
	// "status" only): no status written, a generation not yet observed, an
	// instance the status calls ready whose Lease has long expired.
	Stale []string `json:"stale,omitempty"`
	// Instances are the ring's instances, sorted by name, then (source
	// "labels") the instances objects are labelled with that have no Lease.
	Instances []InstanceReport `json:"instances"`
	// ReadyInstances counts instances in state ready.
	ReadyInstances int `json:"readyInstances"`
	// Objects counts main objects in the ring's namespaces.
	Objects int `json:"objects"`
	// Unassigned counts main objects without a shard label.
	Unassigned int `json:"unassigned"`
	// Drains counts main objects carrying the drain label (drains in flight).
	Drains int `json:"drains"`
	// ObjectsWithoutLease counts main objects labelled with an instance that
	// has no Lease in the ring: nobody reconciles them until the sharder
	// moves them.
	ObjectsWithoutLease int `json:"objectsWithoutLease,omitempty"`
	// Problems are what the command could not read (resources not served or
	// forbidden, Leases it may not list).
	Problems []string `json:"problems,omitempty"`
}

// InstanceReport is one instance of a ring.
type InstanceReport struct {
	Name string `json:"name"`
	// State is the instance's state: ready, restarting, expired, uncertain, vanished,
	// dead, orphaned or invalid; no-lease (source "labels") for an instance
	// only labels name.
	State string `json:"state"`
	// VirtualNodes is the instance's weight (the ring's default unless its
	// Lease says otherwise).
	VirtualNodes int `json:"virtualNodes"`
	// Objects counts main objects labelled with the instance.
	Objects int `json:"objects"`
	// Controlled counts controlled objects labelled with the instance, and
	// Drains the instance's main objects carrying the drain label. Both are
	// counted only from the labels (source "labels"); the ring's status does
	// not carry them.
	Controlled *int `json:"controlled,omitempty"`
	Drains     *int `json:"drains,omitempty"`
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
	recount bool
	now     func() time.Time
	// wrap, when set, wraps the transport of every request (tests count
	// requests with it).
	wrap transport.WrapperFunc
}

// NewStatusCommand returns `sharder status`.
func NewStatusCommand() *cobra.Command {
	o := &statusOptions{now: time.Now}
	cmd := &cobra.Command{
		Use:   "status [RING]",
		Short: "Show rings, instances, objects per instance and drains in flight",
		Long: `Show one ring, or every ring: its instances with their state and weight, the
objects assigned to each instance, the drains in flight and the objects nobody
holds.

By default the command shows each ring's status as the sharder last wrote it
(one read per ring) with its instances' Leases (one list per ring): it never
lists the rings' objects, so it is cheap on any cluster. The status is only as
fresh as the sharder keeps it; the command says when it may be stale (no status
yet, a spec change not yet observed, an instance called ready whose Lease has
long expired), which usually means the sharder is not running.

With --recount the command counts everything itself from the objects' labels
and the Leases, whether or not the sharder runs: it lists the metadata of every
object of the rings' resources, and adds per instance its controlled objects,
its drains, and the instances objects are labelled with that have no Lease.`,
		Example: `  sharder status
  sharder status etcd-operator
  sharder status etcd-operator --recount
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
	cmd.Flags().BoolVar(&o.recount, "recount", false,
		"Count objects from their labels instead of reading the rings' status. Lists the metadata of every object of the rings' resources.")
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
	if o.wrap != nil {
		cfg.Wrap(o.wrap)
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
	var report *StatusReport
	if o.recount {
		report, err = recountStatus(ctx, c, m, rings, o.now())
	} else {
		report, err = readStatus(ctx, c, rings, o.now())
	}
	if err != nil {
		return err
	}
	return writeStatus(out, o.output, report)
}

// newRingReport returns the report of ring with what its spec and Ready
// condition say.
func newRingReport(ring *v1alpha1.ControllerRing, source string) RingReport {
	r := RingReport{
		Name:               ring.Name,
		Algorithm:          ring.Spec.EffectiveAlgorithm(),
		LeaseNamespace:     ring.Spec.LeaseNamespace,
		Source:             source,
		Generation:         ring.Generation,
		ObservedGeneration: ring.Status.ObservedGeneration,
		Ready:              string(metav1.ConditionUnknown),
	}
	if cond := meta.FindStatusCondition(ring.Status.Conditions, v1alpha1.ConditionReady); cond != nil {
		r.Ready, r.Reason, r.Message = string(cond.Status), cond.Reason, cond.Message
	}
	return r
}

// readStatus makes the report of rings from their status and Leases. It
// lists no object: per ring it lists only the ring's Leases.
func readStatus(ctx context.Context, c client.Client, rings []v1alpha1.ControllerRing, now time.Time) (*StatusReport, error) {
	report := &StatusReport{Time: metav1.NewTime(now), Rings: []RingReport{}}
	for i := range rings {
		ring := &rings[i]
		r := newRingReport(ring, sourceStatus)
		leases, err := leasesOf(ctx, c, ring)
		if err != nil {
			if ctx.Err() != nil {
				return nil, err
			}
			r.Problems = append(r.Problems, err.Error()+" (instances are shown from the status alone)")
		}
		instances := instancesFromStatus(ring, leases, err == nil, now, &r)
		r.Instances = sortedInstances(instances)
		r.ReadyInstances = countReady(r.Instances)
		report.Rings = append(report.Rings, r)
	}
	slices.SortFunc(report.Rings, func(a, b RingReport) int { return cmp.Compare(a.Name, b.Name) })
	return report, nil
}

// instancesFromStatus returns the ring's members as its status lists them,
// with their Leases' holder and renewal, and the Leases the status does not
// list. It fills r's counts and the reasons the status may be stale; only
// when haveLeases (the Leases could be listed) does it judge the members by
// their Leases.
func instancesFromStatus(ring *v1alpha1.ControllerRing, leases []coordinationv1.Lease, haveLeases bool, now time.Time, r *RingReport) map[string]*InstanceReport {
	st := &ring.Status
	switch {
	case st.ObservedGeneration == 0: // the sharder writes it with every status; generations start at 1
		r.Stale = append(r.Stale, "the sharder has not written the ring's status yet")
	case st.ObservedGeneration < ring.Generation:
		r.Stale = append(r.Stale, fmt.Sprintf("the status describes generation %d of the ring, which is at generation %d",
			st.ObservedGeneration, ring.Generation))
	}
	r.Objects, r.Unassigned, r.Drains = int(st.Objects), int(st.UnassignedObjects), int(st.Drains)

	byName := make(map[string]*coordinationv1.Lease, len(leases))
	for i := range leases {
		byName[leases[i].Name] = &leases[i]
	}
	instances := make(map[string]*InstanceReport, len(st.Members)+len(leases))
	held := 0
	for _, m := range st.Members {
		inst := &InstanceReport{Name: m.Name, State: m.State, VirtualNodes: int(m.VirtualNodes), Objects: int(m.Objects)}
		held += inst.Objects
		instances[m.Name] = inst
		lease, ok := byName[m.Name]
		if !haveLeases {
			continue
		}
		if !ok {
			inst.Note = "no Lease in the ring"
			if m.State == string(membership.StateReady) {
				r.Stale = append(r.Stale, fmt.Sprintf("the status says instance %s is ready, but it has no Lease in the ring", m.Name))
			}
			continue
		}
		inst.Holder, inst.RenewTime = ptr.Deref(lease.Spec.HolderIdentity, ""), lease.Spec.RenewTime
		inst.Note = leaseNote(lease)
		if m.State == string(membership.StateReady) {
			t, d := membership.ReferenceTime(lease), membership.DurationOf(lease)
			if since := now.Sub(t); since >= 2*d {
				r.Stale = append(r.Stale, fmt.Sprintf("the status says instance %s is ready, but its Lease was last renewed %s ago (lease duration %s)",
					m.Name, duration.HumanDuration(since), d))
			}
		}
	}
	for i := range leases {
		lease := &leases[i]
		if _, ok := instances[lease.Name]; ok {
			continue
		}
		inst := leaseInstance(ring, lease, now)
		inst.Note = joinNotes("not in the ring's status: state computed from the Lease", inst.Note)
		instances[lease.Name] = inst
	}
	if n := r.Objects - r.Unassigned - held; n > 0 {
		r.ObjectsWithoutLease = n
	}
	return instances
}

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

// leasesOf lists the ring's instance Leases.
func leasesOf(ctx context.Context, c client.Client, ring *v1alpha1.ControllerRing) ([]coordinationv1.Lease, error) {
	list := &coordinationv1.LeaseList{}
	if err := c.List(ctx, list, client.InNamespace(ring.Spec.LeaseNamespace), client.MatchingLabels{v1alpha1.LabelRing: ring.Name}); err != nil {
		return nil, fmt.Errorf("listing the Leases of ring %s in namespace %s: %w", ring.Name, ring.Spec.LeaseNamespace, err)
	}
	return list.Items, nil
}

// leaseInstance returns the instance of lease with the state the command
// computes from the Lease alone (membership.StateOf) and its weight.
func leaseInstance(ring *v1alpha1.ControllerRing, lease *coordinationv1.Lease, now time.Time) *InstanceReport {
	state, _ := membership.StateOf(lease, now)
	inst := &InstanceReport{
		Name:         lease.Name,
		State:        string(state),
		VirtualNodes: ring.Spec.EffectiveVirtualNodes(),
		Holder:       ptr.Deref(lease.Spec.HolderIdentity, ""),
		RenewTime:    lease.Spec.RenewTime,
		Note:         leaseNote(lease),
	}
	if weight, err := membership.VirtualNodesOf(lease); err == nil && weight > 0 {
		inst.VirtualNodes = weight
	}
	return inst
}

// leaseNote says what is odd about a Lease: who holds it when its instance
// does not, a malformed weight label.
func leaseNote(lease *coordinationv1.Lease) string {
	var note string
	switch holder := ptr.Deref(lease.Spec.HolderIdentity, ""); {
	case holder == "":
		note = "Lease released"
	case holder != lease.Name:
		note = "Lease held by " + holder
	}
	if _, err := membership.VirtualNodesOf(lease); err != nil {
		note = joinNotes(note, err.Error()+" (the ring's default weight applies)")
	}
	return note
}

func joinNotes(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + "; " + b
}

func countReady(instances []InstanceReport) int {
	n := 0
	for _, inst := range instances {
		if inst.State == string(membership.StateReady) {
			n++
		}
	}
	return n
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
				*inst.Drains++
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
					*instance(owner).Controlled++
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

// writeStatusTable prints each ring as a few header lines and a table of its
// instances.
func writeStatusTable(out io.Writer, report *StatusReport) error {
	if len(report.Rings) == 0 {
		_, err := fmt.Fprintln(out, "No ControllerRings found.")
		return err
	}
	var errs []error
	printf := func(w io.Writer, format string, a ...any) {
		_, err := fmt.Fprintf(w, format, a...)
		errs = append(errs, err)
	}
	for i, r := range report.Rings {
		if i > 0 {
			printf(out, "\n")
		}
		ready := "Ready=" + r.Ready
		if r.Reason != "" {
			ready += " (" + r.Reason + ")"
		}
		printf(out, "Ring %s: %s, %s, Leases in %s\n", r.Name, ready, r.Algorithm, r.LeaseNamespace)
		switch {
		case r.Source == sourceLabels:
			printf(out, "  %d instances (%d ready), %d objects, %d unassigned, %d drains in flight\n",
				len(r.Instances), r.ReadyInstances, r.Objects, r.Unassigned, r.Drains)
			printf(out, "  source: the labels, counted just now (--recount)\n")
		case r.ObservedGeneration == 0:
			printf(out, "  %d instances (%d ready), objects not counted\n", len(r.Instances), r.ReadyInstances)
			printf(out, "  source: the ring's status, not written yet\n")
		default:
			printf(out, "  %d instances (%d ready), %d objects, %d unassigned, %d drains in flight\n",
				len(r.Instances), r.ReadyInstances, r.Objects, r.Unassigned, r.Drains)
			printf(out, "  source: the ring's status (observed generation %d, ring generation %d)\n", r.ObservedGeneration, r.Generation)
		}
		if r.Ready != string(metav1.ConditionTrue) && r.Message != "" {
			printf(out, "  message: %s\n", oneLine(r.Message))
		}
		for _, s := range r.Stale {
			printf(out, "  status may be stale: %s\n", oneLine(s))
		}
		if len(r.Stale) > 0 {
			printf(out, "  the sharder may not be running: check its pods, or count from the labels with --recount\n")
		}
		if r.Source == sourceStatus && r.ObjectsWithoutLease > 0 {
			printf(out, "  %d objects are labelled with instances that have no Lease in the ring (--recount names them)\n", r.ObjectsWithoutLease)
		}
		for _, p := range r.Problems {
			printf(out, "  problem: %s\n", oneLine(p))
		}
		if len(r.Instances) == 0 {
			continue
		}
		printf(out, "\n")
		recounted := r.Source == sourceLabels
		assigned := r.Objects - r.Unassigned
		tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		if recounted {
			printf(tw, "  INSTANCE\tSTATE\tWEIGHT\tOBJECTS\tSHARE\tCONTROLLED\tDRAINS\tRENEWED\tNOTE\n")
		} else {
			printf(tw, "  INSTANCE\tSTATE\tWEIGHT\tOBJECTS\tSHARE\tRENEWED\tNOTE\n")
		}
		for _, inst := range r.Instances {
			share := "-"
			if assigned > 0 {
				share = fmt.Sprintf("%.1f%%", 100*float64(inst.Objects)/float64(assigned))
			}
			weight := "-"
			if inst.State != stateUnknownInstance {
				weight = fmt.Sprint(inst.VirtualNodes)
			}
			counts := ""
			if recounted {
				counts = fmt.Sprintf("%d\t%d\t", ptr.Deref(inst.Controlled, 0), ptr.Deref(inst.Drains, 0))
			}
			printf(tw, "  %s\t%s\t%s\t%d\t%s\t%s%s\t%s\n",
				inst.Name, inst.State, weight, inst.Objects, share, counts, renewed(inst.RenewTime, report.Time.Time), oneLine(inst.Note))
		}
		errs = append(errs, tw.Flush())
	}
	return errors.Join(errs...)
}

// renewed says how long before now the Lease was last renewed.
func renewed(t *metav1.MicroTime, now time.Time) string {
	switch {
	case t == nil:
		return "-"
	case t.After(now):
		return "in " + duration.HumanDuration(t.Sub(now))
	}
	return duration.HumanDuration(now.Sub(t.Time)) + " ago"
}

func oneLine(s string) string { return strings.ReplaceAll(s, "\n", " ") }
