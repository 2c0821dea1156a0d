package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	etcdv1alpha1 "github.com/sharder-dev/sharder/examples/etcd-operator/api/v1alpha1"
	"github.com/sharder-dev/sharder/internal/localrun"
	"github.com/sharder-dev/sharder/internal/reconcilelog"
	"github.com/sharder-dev/sharder/internal/testenv"
	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/slots"
)

// What slot mode adds to the demo (--unit slots): the example's ring as its
// slot-mode variant declares it, the policy that guards the slot label, and
// a view of the ring's slot table and of the EtcdClusters' slot labels.
const (
	// slotsKustomization is the example operator with its ring in slot mode.
	slotsKustomization = "examples/etcd-operator/config-slots"
	// slotPolicyManifest is the ValidatingAdmissionPolicy that guards the
	// slot label, as config/default and the chart install it.
	slotPolicyManifest = "config/policy/slot_label_policy.yaml"
)

// slotRing renders the kustomization in dir with kubectl and returns the
// ControllerRing it declares.
func slotRing(ctx context.Context, kubectl, dir string) (*sharderv1alpha1.ControllerRing, error) {
	cmd := exec.CommandContext(ctx, kubectl, "kustomize", dir) //nolint:gosec // the repository's kubectl on the repository's kustomization
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	manifests, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("kubectl kustomize %s: %w\n%s", dir, err, stderr.String())
	}
	objs, err := testenv.DecodeObjects(manifests)
	if err != nil {
		return nil, fmt.Errorf("reading the manifests of %s: %w", dir, err)
	}
	for _, o := range objs {
		if o.GetKind() != "ControllerRing" {
			continue
		}
		data, err := yaml.Marshal(o.Object)
		if err != nil {
			return nil, err
		}
		ring := &sharderv1alpha1.ControllerRing{}
		if err := yaml.UnmarshalStrict(data, ring); err != nil {
			return nil, fmt.Errorf("the ControllerRing of %s: %w", dir, err)
		}
		if !ring.Spec.AssignsSlots() {
			return nil, fmt.Errorf("the ControllerRing of %s does not assign slots", dir)
		}
		return ring, nil
	}
	return nil, fmt.Errorf("%s declares no ControllerRing", dir)
}

// installSlotPolicy creates the objects of the manifest at path: the
// ValidatingAdmissionPolicy that the sharder binds to each ring of unit
// Slots.
func installSlotPolicy(ctx context.Context, c client.Client, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	objs, err := testenv.DecodeObjects(data)
	if err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	for _, o := range objs {
		if err := c.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating %s %s: %w", o.GetKind(), o.GetName(), err)
		}
		fmt.Fprintf(out, "    %s %s guards the slot label (%s, as the chart installs it)\n", o.GetKind(), o.GetName(), slotPolicyManifest)
	}
	return nil
}

// slotView reads a ring of unit Slots and the EtcdClusters of the demo's
// namespace straight from the API server: the slot table in the ring's
// status, each cluster's slot label and resourceVersion, and the
// acknowledgements on the instances' Leases.
type slotView struct {
	c              client.WithWatch
	ring           string
	count          int
	leaseNamespace string
	// reconcileLog returns the reconcile log of an instance (the example
	// operator's --reconcile-log); nil when the instances keep none (pods).
	reconcileLog func(id string) string
	// quiet is how long no EtcdCluster may have been written for the ring
	// to count as settled: the operator writes a new cluster's status in
	// its first reconciles, which a join should not be mistaken for. 0 on
	// the real cluster, where the status follows the etcd pods as they
	// start.
	quiet time.Duration
}

func newSlotView(cfg *rest.Config, scheme *runtime.Scheme, ring *sharderv1alpha1.ControllerRing) (*slotView, error) {
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	return &slotView{c: c, ring: ring.Name, count: ring.Spec.EffectiveSlotCount(), leaseNamespace: ring.Spec.LeaseNamespace}, nil
}

// slotState is what a slotView read at one moment.
type slotState struct {
	ring  *sharderv1alpha1.ControllerRing
	table slots.Table
	// clusters are the EtcdClusters, by name.
	clusters map[string]clusterState
	// acknowledged is the revision each instance's Lease acknowledges.
	acknowledged map[string]int64
	// leasesVersion is the resourceVersion of the list of the Leases.
	leasesVersion string
}

// clusterState is an EtcdCluster as a slotView saw it.
type clusterState struct {
	// slot is the slot its label names, -1 without one.
	slot            int
	resourceVersion string
	// metadata is its labels, annotations and finalizers, as text.
	metadata string
	// writer is the field manager of its latest write.
	writer string
}

func (v *slotView) read(ctx context.Context) (*slotState, error) {
	s := &slotState{ring: &sharderv1alpha1.ControllerRing{}, clusters: map[string]clusterState{}, acknowledged: map[string]int64{}}
	if err := v.c.Get(ctx, client.ObjectKey{Name: v.ring}, s.ring); err != nil {
		return nil, err
	}
	var err error
	if s.table, err = slots.FromStatus(v.count, s.ring.Status.Slots); err != nil {
		return nil, fmt.Errorf("the slot table of ring %s: %w", v.ring, err)
	}
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(etcdv1alpha1.GroupVersion.WithKind("EtcdClusterList"))
	if err := v.c.List(ctx, list, client.InNamespace(demoNamespace)); err != nil {
		return nil, err
	}
	label := sharderv1alpha1.SlotLabel(v.ring)
	for i := range list.Items {
		m := &list.Items[i]
		c := clusterState{slot: -1, resourceVersion: m.ResourceVersion,
			metadata: fmt.Sprint(m.Labels, m.Annotations, m.Finalizers), writer: lastWriter(m)}
		if value, ok := m.Labels[label]; ok {
			if c.slot, err = slots.ParseLabel(value, v.count); err != nil {
				return nil, fmt.Errorf("EtcdCluster %s: %w", m.Name, err)
			}
		}
		s.clusters[m.Name] = c
	}
	leases := &coordinationv1.LeaseList{}
	if err := v.c.List(ctx, leases, client.InNamespace(v.leaseNamespace), client.MatchingLabels{sharderv1alpha1.LabelRing: v.ring}); err != nil {
		return nil, err
	}
	for _, l := range leases.Items {
		s.acknowledged[l.Name] = slots.ParseAcknowledgement(l.Annotations[sharderv1alpha1.AnnotationSlotsAcknowledged], s.ring.UID)
	}
	s.leasesVersion = leases.ResourceVersion
	return s, nil
}

// lastWriter names the field manager (and subresource) of the latest entry
// of an object's managed fields.
func lastWriter(m *metav1.PartialObjectMetadata) string {
	var last *metav1.ManagedFieldsEntry
	for i := range m.ManagedFields {
		f := &m.ManagedFields[i]
		if f.Time != nil && (last == nil || !f.Time.Before(last.Time)) {
			last = f
		}
	}
	switch {
	case last == nil:
		return "?"
	case last.Subresource != "":
		return last.Manager + " (" + last.Subresource + ")"
	default:
		return last.Manager
	}
}

// holderOf returns the instance each EtcdCluster's slot is granted to.
func (s *slotState) holderOf(name string) string {
	c := s.clusters[name]
	if c.slot < 0 || c.slot >= len(s.table.Slots) || s.table.Slots[c.slot].Releasing {
		return ""
	}
	return s.table.Slots[c.slot].Holder
}

// tableSettled returns nil when the table grants every slot to one of ids,
// none releasing, each id holding its share to within one slot (the
// instances have equal weights).
func tableSettled(t slots.Table, ids []string) error {
	if t.Revision == 0 {
		return errors.New("the sharder has not written the slot table yet")
	}
	held := map[string]int{}
	for i, s := range t.Slots {
		switch {
		case s.Holder == "":
			return fmt.Errorf("slot %d is unassigned", i)
		case s.Releasing:
			return fmt.Errorf("slot %d is releasing from %s", i, s.Holder)
		case !slices.Contains(ids, s.Holder):
			return fmt.Errorf("slot %d is granted to %s, not one of %v", i, s.Holder, ids)
		}
		held[s.Holder]++
	}
	share := len(t.Slots) / len(ids)
	for _, id := range ids {
		if n := held[id]; n < share || n > share+1 {
			return fmt.Errorf("%s holds %d slots, not its share (%d or %d)", id, n, share, share+1)
		}
	}
	return nil
}

// settled returns nil when the table is settled on ids and each of the n
// EtcdClusters carries its slot label and, where the instances keep
// reconcile logs, was reconciled by its slot's instance.
func (v *slotView) settled(s *slotState, n int, ids []string) error {
	if err := tableSettled(s.table, ids); err != nil {
		return err
	}
	if len(s.clusters) != n {
		return fmt.Errorf("%d EtcdClusters, want %d", len(s.clusters), n)
	}
	for name, c := range s.clusters {
		if c.slot < 0 {
			return fmt.Errorf("EtcdCluster %s has no slot label yet", name)
		}
	}
	return v.reconciledByHolders(s)
}

// reconciledByHolders returns nil when each EtcdCluster has been reconciled
// to its end by the instance its slot is granted to, by the instances'
// reconcile logs; nil at once without them.
func (v *slotView) reconciledByHolders(s *slotState) error {
	if v.reconcileLog == nil {
		return nil
	}
	done := map[string]map[string]bool{} // instance → namespace/name → reconciled
	for name := range s.clusters {
		id := s.holderOf(name)
		if done[id] == nil {
			entries, err := reconcilelog.Read(v.reconcileLog(id))
			if err != nil {
				return err
			}
			done[id] = map[string]bool{}
			for _, e := range entries {
				if e.Phase == reconcilelog.PhaseEnd && e.Error == "" {
					done[id][e.Object] = true
				}
			}
		}
		if !done[id][demoNamespace+"/"+name] {
			return fmt.Errorf("EtcdCluster %s not reconciled by %s yet", name, id)
		}
	}
	return nil
}

// waitSettled waits until the table is settled on ids and every one of the
// n EtcdClusters carries its slot label (and was reconciled by its slot's
// instance), and returns what it read then.
func (v *slotView) waitSettled(ctx context.Context, n int, ids []string) (*slotState, error) {
	start := time.Now()
	s, err := v.poll(ctx, n, ids, v.quiet)
	if err != nil {
		return nil, err
	}
	what := "carry their slot label"
	if v.reconcileLog != nil {
		what += " and were reconciled by their slot's instance"
	}
	if v.quiet > 0 {
		what += fmt.Sprintf(", none written in the last %s", v.quiet)
	}
	fmt.Fprintf(out, "    all %d slots granted to their instances (table revision %d); all %d EtcdClusters %s (%s)\n",
		v.count, s.table.Revision, n, what, time.Since(start).Round(time.Millisecond))
	return s, nil
}

// poll waits until the table is settled on ids, every one of the n
// EtcdClusters carries its slot label (and was reconciled by its slot's
// instance), and none was written for quiet.
func (v *slotView) poll(ctx context.Context, n int, ids []string, quiet time.Duration) (*slotState, error) {
	var s *slotState
	var versions map[string]string
	var writtenAt time.Time
	err := localrun.Poll(ctx, 3*time.Minute, 200*time.Millisecond, func() error {
		var err error
		if s, err = v.read(ctx); err != nil {
			return err
		}
		if now := s.versions(); !maps.Equal(now, versions) {
			versions, writtenAt = now, time.Now()
		}
		if err := v.settled(s, n, ids); err != nil {
			return err
		}
		if since := time.Since(writtenAt); since < quiet {
			return fmt.Errorf("an EtcdCluster was written %s ago", since.Round(time.Millisecond))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("waiting for the slot table: %w", err)
	}
	return s, nil
}

// versions returns the resourceVersion of each EtcdCluster.
func (s *slotState) versions() map[string]string {
	m := make(map[string]string, len(s.clusters))
	for name, c := range s.clusters {
		m[name] = c.resourceVersion
	}
	return m
}

// show prints the membership, the ring and its slot table with the
// EtcdClusters per instance.
func (v *slotView) show(ctx context.Context, k kube, s *slotState) {
	step("Membership: kubectl get leases -A -l sharder.dev/ring -L sharder.dev/ring,sharder.dev/state")
	k.run(ctx, "get", "leases", "-A", "-l", sharderv1alpha1.LabelRing,
		"-L", strings.Join([]string{sharderv1alpha1.LabelRing, sharderv1alpha1.LabelState}, ","))
	step("The ring: kubectl get controllerrings")
	k.run(ctx, "get", "controllerrings")
	step("The slot table (status.slots of ring %s, revision %d) and the EtcdClusters in each instance's slots", v.ring, s.table.Revision)
	fmt.Fprint(out, formatSlotTable(s))
}

// formatSlotTable renders the table per instance: its slots, their ranges
// and the EtcdClusters whose slot label names one of them.
func formatSlotTable(s *slotState) string {
	clusters := map[string]int{}
	for name := range s.clusters {
		clusters[s.holderOf(name)]++
	}
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "  INSTANCE\tSLOTS\tETCDCLUSTERS\tGRANTED\tRELEASING")
	var unassigned []int
	for i, slot := range s.table.Slots {
		if slot.Holder == "" {
			unassigned = append(unassigned, i)
		}
	}
	holders := map[string]bool{}
	for _, h := range s.table.Holders() {
		if h != "" {
			holders[h] = true
		}
	}
	ids := make([]string, 0, len(holders))
	for h := range holders {
		ids = append(ids, h)
	}
	slices.Sort(ids)
	for _, id := range ids {
		granted, releasing := s.table.HeldBy(id)
		fmt.Fprintf(w, "  %s\t%d\t%d\t%s\t%s\n", id, len(granted), clusters[id], orNone(slots.FormatList(granted)), orNone(slots.FormatList(releasing)))
	}
	if len(unassigned) > 0 || clusters[""] > 0 {
		fmt.Fprintf(w, "  (unassigned or releasing)\t%d\t%d\t%s\t\n", len(unassigned), clusters[""], orNone(slots.FormatList(unassigned)))
	}
	_ = w.Flush()
	return b.String()
}

func orNone(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// follow waits until the table is settled on ids after before, then
// prints each change of the table and each acknowledgement on a Lease in
// the order they were written (by resourceVersion, once the Leases' watch
// has passed the table's last write), and returns the time the table
// settled.
func (v *slotView) follow(ctx context.Context, before *slotState, ids []string) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	rings, err := v.c.Watch(ctx, &sharderv1alpha1.ControllerRingList{}, &client.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("metadata.name", v.ring),
		Raw:           &metav1.ListOptions{ResourceVersion: before.ring.ResourceVersion},
	})
	if err != nil {
		return time.Time{}, fmt.Errorf("watching ring %s: %w", v.ring, err)
	}
	defer rings.Stop()
	leases, err := v.c.Watch(ctx, &coordinationv1.LeaseList{}, client.InNamespace(v.leaseNamespace),
		client.MatchingLabels{sharderv1alpha1.LabelRing: v.ring}, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: before.leasesVersion}})
	if err != nil {
		return time.Time{}, fmt.Errorf("watching the Leases of ring %s: %w", v.ring, err)
	}
	defer leases.Stop()

	var events []joinEvent
	table, acknowledged := before.table, maps.Clone(before.acknowledged)
	var leasesAt, settledRV uint64 // the resourceVersion the Leases' watch reached; the table's settling write
	lease := func(ev watch.Event, ok bool) error {
		if !ok {
			return errors.New("the watch of the Leases ended")
		}
		l, isLease := ev.Object.(*coordinationv1.Lease)
		if !isLease {
			return watchError("Leases", ev)
		}
		rv := resourceVersion(l)
		leasesAt = max(leasesAt, rv)
		if rev := slots.ParseAcknowledgement(l.Annotations[sharderv1alpha1.AnnotationSlotsAcknowledged], before.ring.UID); rev > acknowledged[l.Name] {
			acknowledged[l.Name] = rev
			events = append(events, joinEvent{rv: rv,
				line: fmt.Sprintf("%s acknowledges on its Lease: it let go of the slots released up to revision %d", l.Name, rev)})
		}
		return nil
	}
	for tableSettled(table, ids) != nil {
		select {
		case ev, ok := <-leases.ResultChan():
			if err := lease(ev, ok); err != nil {
				return time.Time{}, err
			}
		case ev, ok := <-rings.ResultChan():
			if !ok {
				return time.Time{}, fmt.Errorf("the watch of ring %s ended: %w", v.ring, tableSettled(table, ids))
			}
			r, isRing := ev.Object.(*sharderv1alpha1.ControllerRing)
			if !isRing {
				return time.Time{}, watchError("the ring", ev)
			}
			next, err := slots.FromStatus(v.count, r.Status.Slots)
			if err != nil || next.Revision <= table.Revision {
				continue // another status write, or a table the sharder reports itself
			}
			settledRV = resourceVersion(r)
			events = append(events, joinEvent{rv: settledRV,
				line: fmt.Sprintf("revision %d: %s", next.Revision, strings.Join(describeChange(table, next), "; "))})
			table = next
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("waiting for the slot table: %w: %w", ctx.Err(), tableSettled(table, ids))
		}
	}
	settledAt := time.Now()
	// An acknowledgement written before the last table may reach this
	// watch after it: wait until the Leases' watch passed the table's write
	// (a renewal comes every few seconds), for the order below.
	for wait := time.After(30 * time.Second); leasesAt < settledRV; {
		select {
		case ev, ok := <-leases.ResultChan():
			if err := lease(ev, ok); err != nil {
				return time.Time{}, err
			}
		case <-wait:
			leasesAt = settledRV
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		}
	}
	slices.SortStableFunc(events, func(a, b joinEvent) int { return cmp.Compare(a.rv, b.rv) })
	for _, e := range events {
		fmt.Fprintf(out, "    %s\n", e.line)
	}
	return settledAt, nil
}

// joinEvent is a line follow prints, at the resourceVersion of the write
// it tells of.
type joinEvent struct {
	rv   uint64
	line string
}

// resourceVersion returns an object's resourceVersion as a number (etcd's
// revision of its last write, which orders writes across objects); 0 when
// it is not a number.
func resourceVersion(obj metav1.Object) uint64 {
	rv, _ := strconv.ParseUint(obj.GetResourceVersion(), 10, 64)
	return rv
}

func watchError(what string, ev watch.Event) error {
	if status, ok := ev.Object.(*metav1.Status); ok {
		return fmt.Errorf("watching %s: %s", what, status.Message)
	}
	return fmt.Errorf("watching %s: unexpected %s event %T", what, ev.Type, ev.Object)
}

// describeChange says what changed for each instance from one table to
// the next.
func describeChange(prev, next slots.Table) []string {
	holders := map[string]bool{}
	for i := range next.Slots {
		holders[prev.Slots[i].Holder], holders[next.Slots[i].Holder] = true, true
	}
	delete(holders, "")
	ids := make([]string, 0, len(holders))
	for h := range holders {
		ids = append(ids, h)
	}
	slices.Sort(ids)
	var lines []string
	for _, id := range ids {
		var released, kept, granted, lost []int
		for i := range next.Slots {
			p, n := prev.Slots[i], next.Slots[i]
			wasGranted, wasReleasing := p.Holder == id && !p.Releasing, p.Holder == id && p.Releasing
			switch {
			case n.Holder == id && n.Releasing && !wasReleasing:
				released = append(released, i)
			case n.Holder == id && !n.Releasing && wasReleasing:
				kept = append(kept, i)
			case n.Holder == id && !n.Releasing && p.Holder != id:
				granted = append(granted, i)
			case n.Holder != id && wasGranted:
				lost = append(lost, i)
			}
		}
		for _, c := range []struct {
			what  string
			slots []int
		}{
			{"is asked to release", released},
			{"keeps, no longer releasing,", kept},
			{"is granted", granted},
			{"loses without a release", lost},
		} {
			if len(c.slots) > 0 {
				lines = append(lines, fmt.Sprintf("%s %s %d slots (%s)", id, c.what, len(c.slots), slots.FormatList(c.slots)))
			}
		}
	}
	if len(lines) == 0 {
		lines = append(lines, "no slot changed holder")
	}
	return lines
}

// reportJoin prints what a join changed between two states: the slots that
// moved and to whom, the table writes, the EtcdClusters that changed
// instance with their slots, and the EtcdClusters written meanwhile.
func reportJoin(before, after *slotState) {
	count := len(after.table.Slots)
	moved, to := 0, map[string]int{}
	movedSlots := map[int]bool{}
	for i := range after.table.Slots {
		if h := after.table.Slots[i].Holder; h != before.table.Slots[i].Holder {
			moved++
			to[h]++
			movedSlots[i] = true
		}
	}
	targets := make([]string, 0, len(to))
	for id, n := range to {
		targets = append(targets, fmt.Sprintf("%d to %s", n, id))
	}
	slices.Sort(targets)
	where := strings.Join(targets, ", ")
	if len(to) == 1 {
		for id := range to {
			where = "all to " + id
		}
	}
	fmt.Fprintf(out, "\n    %d of %d slots moved (ideal: a quarter, %d), %s, in %d writes of the slot table (revision %d → %d)\n",
		moved, count, count/4, where, after.table.Revision-before.table.Revision, before.table.Revision, after.table.Revision)
	inMoved := 0
	for _, c := range after.clusters {
		if movedSlots[c.slot] {
			inMoved++
		}
	}
	fmt.Fprintf(out, "    %d of %d EtcdClusters are in those slots: they changed instance with them\n", inMoved, len(after.clusters))

	var written []string
	for name, b := range before.clusters {
		a, ok := after.clusters[name]
		switch {
		case !ok:
			written = append(written, name+" (deleted)")
		case a.resourceVersion == b.resourceVersion:
		case a.metadata != b.metadata:
			written = append(written, fmt.Sprintf("%s (its metadata, last by %s: %s → %s)", name, a.writer, b.metadata, a.metadata))
		default:
			written = append(written, fmt.Sprintf("%s (its status, by %s)", name, a.writer))
		}
	}
	slices.Sort(written)
	if len(written) == 0 {
		fmt.Fprintf(out, "    no EtcdCluster was written: the resourceVersions of all %d are those they had before the join\n", len(before.clusters))
		return
	}
	fmt.Fprintf(out, "    %d of %d EtcdClusters were written during the join: %s\n", len(written), len(before.clusters), strings.Join(written, ", "))
}

// slotStory shows the slot table, then a fourth instance joining, to which
// a quarter of the slots moves with no EtcdCluster written.
func (d *demo) slotStory(ctx context.Context, clusters int, h hooks) error {
	d.slots.reconcileLog, d.slots.quiet = d.reconcileLog, 3*time.Second
	before, err := d.slots.waitSettled(ctx, clusters, d.liveInstances())
	if err != nil {
		return err
	}
	d.slots.show(ctx, d.kube, before)
	label := sharderv1alpha1.SlotLabel(d.ring.Name)
	step("Slot labels: kubectl get etcdclusters -n %s -L %s (the first five)", demoNamespace, label)
	names := make([]string, 0, 5)
	for i := range min(5, clusters) {
		names = append(names, clusterName(i))
	}
	d.kube.run(ctx, append([]string{"get", "etcdclusters", "-n", demoNamespace, "-L", label}, names...)...)
	if err := call(h.joining); err != nil {
		return err
	}

	step("Adding a fourth instance: the sharder moves a quarter of the slots to it, writing the slot table, no EtcdCluster")
	if err := d.startInstance(ctx, 3); err != nil {
		return err
	}
	fmt.Fprintln(out, "    each old holder is asked to release slots and acknowledges on its Lease, then the sharder grants them:")
	settledAt, err := d.slots.follow(ctx, before, d.liveInstances())
	if err != nil {
		return err
	}
	reconciled, err := d.slots.poll(ctx, clusters, d.liveInstances(), 0)
	if err != nil {
		return err
	}
	newID, inSlots := d.instances[3].Name, 0
	for name := range reconciled.clusters {
		if reconciled.holderOf(name) == newID {
			inSlots++
		}
	}
	fmt.Fprintf(out, "    %s reconciled each of the %d EtcdClusters of its slots (by its reconcile log) within %s of the table's last grant\n",
		newID, inSlots, time.Since(settledAt).Round(100*time.Millisecond))
	after, err := d.slots.waitSettled(ctx, clusters, d.liveInstances())
	if err != nil {
		return err
	}
	if err := call(h.joined); err != nil {
		return err
	}
	d.slots.show(ctx, d.kube, after)
	step("sharder status %s", d.ring.Name)
	cmd := exec.CommandContext(ctx, d.cl.Binaries.Sharder, "status", "--kubeconfig", d.kube.kubeconfig, d.ring.Name) //nolint:gosec // the sharder just built
	cmd.Stdout, cmd.Stderr = out, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "sharder status: %v\n", err)
	}
	reportJoin(before, after)
	return nil
}

// clusterName is the name of the demo's i-th EtcdCluster.
func clusterName(i int) string { return fmt.Sprintf("etcd-%03d", i) }

// reconcileLog is the file an instance records its reconciles in.
func (d *demo) reconcileLog(id string) string {
	return filepath.Join(d.cl.Dir, "reconciles", id+".jsonl")
}

// slotOf returns the slot of the demo's EtcdCluster name on the ring.
func slotOf(ring *sharderv1alpha1.ControllerRing, name string) int {
	gk := etcdClusterKind
	return slots.ForMainObject(&ring.Spec, gk.Group, gk.Kind, demoNamespace, name)
}

func (d *demo) slotInstructions() {
	label := sharderv1alpha1.SlotLabel(d.ring.Name)
	other := (slotOf(d.ring, clusterName(0)) + 1) % d.ring.Spec.EffectiveSlotCount()
	step("The demo keeps running. In another shell:")
	fmt.Fprintf(out, `
    export KUBECONFIG=%s PATH=%s:$PATH

    kubectl get etcdclusters -n %s -L %s
    kubectl get statefulsets,services,configmaps -n %s -L %s   # children carry their cluster's slot
    kubectl get leases -A -l sharder.dev/ring -L sharder.dev/ring,sharder.dev/state
    kubectl get controllerring %s -o yaml        # status.slots: the slot table
    %s status %s                 # slots per instance

    # A slot label never changes: this is denied by the policy slot-label.sharder.dev.
    kubectl label etcdcluster -n %s %s %s=%d --overwrite

    # Kill an instance: its Lease expires, the sharder declares it dead after
    # 2 × %s and grants its slots to the others.
    kill -9 %d
    # Or stop one gracefully: it releases its Lease and its slots move at once.
    kill %d

Logs of every process: %s
Press Ctrl-C to stop the demo and clean up.
`, d.kube.kubeconfig, filepath.Dir(d.kube.kubectl), demoNamespace, label, demoNamespace, label, d.ring.Name,
		d.cl.Binaries.Sharder, d.ring.Name,
		demoNamespace, clusterName(0), label, other, d.leaseDuration, d.instances[1].Pid(), d.instances[2].Pid(), d.cl.LogDir)
}
