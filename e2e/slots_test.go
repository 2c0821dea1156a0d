package e2e

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/internal/reconcilelog"
	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/slots"
)

// SlotModeInput configures SlotModeSpec.
type SlotModeInput struct {
	// Instances at the start; one more joins, one is killed, one more
	// joins after the sharder leader is killed.
	Instances int
	// Objects is the number of EtcdClusters at the start; as many more are
	// created while the sharder leader is killed.
	Objects int
	// Slots is the ring's slot count.
	Slots int
	// MaxControlWrites bounds the writes of the ring (its status: the slot
	// table and the counts) and the Leases' labels and annotations (state
	// labels, acknowledgements; not renewals) that one membership change
	// may cost.
	MaxControlWrites int
	// LeaseDuration of the instances' Leases.
	LeaseDuration time.Duration
	// Timeout bounds each wait.
	Timeout time.Duration
}

// SlotModeSpec runs a ring of unit Slots (docs/design.md §11) through what
// object mode's scenarios run it through, checking what slot mode promises:
//
//   - every EtcdCluster gets its slot label (the slot of its key), and is
//     reconciled by the instance its slot is granted to, only;
//   - a new instance takes its share of the slots, moved by table writes
//     and acknowledgements: no object is written from the start of the
//     scale-out until the moved slots' objects are reconciled by the new
//     instance (but the status writes of the operator's own reconciles),
//     and the change costs at most MaxControlWrites writes of the ring and
//     the Leases' metadata;
//   - the slots of an instance killed with SIGKILL stay with it until the
//     lease protocol declares it dead (2 × lease duration after its last
//     renewal), then go to the others;
//   - killing the sharder leader hands over to the other replica, which
//     labels the objects created meanwhile and moves slots to an instance
//     joining after;
//   - throughout, no table the sharder wrote lists a slot twice, every
//     table write raises the revision, no object is reconciled by two
//     instances at once, and in the end every object is on a live instance.
func SlotModeSpec(t *testing.T, in SlotModeInput) {
	e := newRingEnv(t, ringOptions{Slots: in.Slots, LeaseDuration: in.LeaseDuration})
	w := newSlotWatch(e, in.Slots)
	e.startInstances(in.Instances)
	e.startSharders()
	e.createClusters("obj", in.Objects)
	n := in.Objects
	before := w.waitSettled(n, in.Timeout, e.liveInstances()...)
	w.expectReconciledByHolder(in.Timeout)
	t.Logf("%d EtcdClusters on %d instances: %s", n, in.Instances, formatSlotCounts(before))

	// Scale-out: slots move, objects are not written.
	added := fmt.Sprintf("instance-%d", in.Instances)
	restarts := e.restartCounts()
	start := time.Now()
	e.startInstance(added)
	after := w.waitSettled(n, in.Timeout, e.liveInstances()...)
	// An instance that could not renew its Lease in time (a starved
	// machine) exits and is restarted, a membership change of its own: the
	// figures of one change hold only without one.
	oneChange := maps.Equal(restarts, e.restartCounts())
	var moved []int
	for slot, holder := range after.holders {
		if prev := before.holders[slot]; prev != holder {
			if oneChange {
				e.g.Expect(holder).To(gomega.Equal(added), "slot %d moved from %s to %s, not to the new instance", slot, prev, holder)
			}
			moved = append(moved, slot)
		}
	}
	e.g.Expect(moved).NotTo(gomega.BeEmpty(), "the new instance got no slot")
	reconciledAt := w.expectReconciledByHolder(in.Timeout)
	end := time.Now()
	var objectWrites, statusWrites []write
	for _, x := range w.objectWrites(start, end) {
		if x.ownStatus {
			statusWrites = append(statusWrites, x)
		} else {
			objectWrites = append(objectWrites, x)
		}
	}
	ringWrites, leaseWrites := w.ringWrites(start, end), w.leaseWrites(start, end)
	var movedObjects []string
	for _, o := range w.objects() {
		if o.holder == added {
			movedObjects = append(movedObjects, o.key)
		}
	}
	// From the table granting the new instance its slots (after the
	// acknowledgements) to its first reconcile of each moved object.
	grantedAt := w.firstGrant(start, added)
	first := map[string]time.Time{}
	for _, iv := range e.intervals() {
		if iv.Instance == added && !iv.Start.Before(grantedAt) && (first[iv.Object].IsZero() || iv.Start.Before(first[iv.Object])) {
			first[iv.Object] = iv.Start
		}
	}
	latest, fromGrant := time.Duration(0), time.Duration(0)
	for _, k := range movedObjects {
		latest = max(latest, reconciledAt[k].Sub(start))
		fromGrant = max(fromGrant, first[k].Sub(grantedAt))
	}
	t.Logf("scale-out %d → %d: %d of %d slots moved (%d objects), in %d ring writes (revision %d → %d) and %d Lease metadata writes; "+
		"%d object writes (besides %d status writes of the operator's reconciles); the moved objects last reconciled by %s within %s of its start, "+
		"first within %s of the table granting it slots (after the acknowledgements)",
		in.Instances, in.Instances+1, len(moved), in.Slots, len(movedObjects), len(ringWrites), before.revision, after.revision,
		len(leaseWrites), len(objectWrites), len(statusWrites), added, latest.Round(10*time.Millisecond), fromGrant.Round(10*time.Millisecond))
	e.g.Expect(objectWrites).To(gomega.BeEmpty(), "objects were written while slots moved: %v", objectWrites)
	if oneChange {
		e.g.Expect(len(ringWrites)+len(leaseWrites)).To(gomega.BeNumerically("<=", in.MaxControlWrites),
			"a scale-out wrote the ring %d times (%v) and the Leases' metadata %d times (%v)", len(ringWrites), ringWrites, len(leaseWrites), leaseWrites)
	} else {
		t.Logf("instances restarted during the scale-out (%v, before %v): the moves and writes of one change are not checked; ring writes %v, Lease writes %v",
			e.restartCounts(), restarts, ringWrites, leaseWrites)
	}
	e.expectNoOverlap()

	// SIGKILL: the victim's slots wait for it to be dead.
	victim := "instance-1"
	var theirs []int
	for slot, holder := range after.holders {
		if holder == victim {
			theirs = append(theirs, slot)
		}
	}
	e.g.Expect(theirs).NotTo(gomega.BeEmpty())
	killedAt := time.Now()
	e.killInstance(victim)
	deadAt := e.lease(victim).Spec.RenewTime.Add(2 * e.opts.LeaseDuration)
	if wait := time.Until(deadAt.Add(-200 * time.Millisecond)); wait > 0 {
		e.g.Consistently(func() error {
			tb := w.table()
			for _, s := range theirs {
				if h := tb.Slots[s].Holder; h != victim {
					return fmt.Errorf("slot %d went to %q before the lease protocol declared %s dead", s, h, victim)
				}
			}
			return nil
		}).WithTimeout(wait).WithPolling(100 * time.Millisecond).Should(gomega.Succeed())
	}
	killed := w.waitSettled(n, in.Timeout, e.liveInstances()...)
	movedAt := w.firstMove(killedAt, theirs, victim)
	e.g.Expect(movedAt).To(gomega.BeTemporally(">=", deadAt), "the killed instance's slots moved before 2 × lease duration")
	for slot, holder := range killed.holders {
		if prev := after.holders[slot]; prev != victim {
			e.g.Expect(holder).To(gomega.Equal(prev), "slot %d was not the killed instance's but moved", slot)
		}
	}
	e.g.Expect(e.lease(victim).Labels[sharderv1alpha1.LabelState]).To(gomega.Equal("dead"))
	w.expectReconciledByHolder(in.Timeout)
	t.Logf("kill -9 of %s: its %d slots moved %s after it was dead, to %s", victim, len(theirs),
		movedAt.Sub(deadAt).Round(10*time.Millisecond), formatSlotCounts(killed))
	e.expectNoOverlap()

	// The sharder leader killed: the other replica labels and moves on.
	old := e.leader()
	e.g.Expect(old.Kill()).To(gomega.Succeed())
	e.createClusters("during", in.Objects)
	n += in.Objects
	survivor := e.leader()
	e.g.Expect(survivor.Name).NotTo(gomega.Equal(old.Name))
	w.waitSettled(n, in.Timeout, e.liveInstances()...)
	joined := fmt.Sprintf("instance-%d", in.Instances+1)
	e.startInstance(joined)
	final := w.waitSettled(n, in.Timeout, e.liveInstances()...)
	e.g.Expect(final.counts[joined]).To(gomega.BeNumerically(">", 0), "the new leader moved no slot to %s", joined)
	w.expectReconciledByHolder(in.Timeout)
	ivs := e.expectNoOverlap()
	e.g.Expect(w.violations()).To(gomega.BeEmpty(), "tables the sharder wrote")
	t.Logf("after the leader %s was killed, %s led: %d objects on %s; %d reconciles checked, %d tables seen, restarts %v",
		old.Name, survivor.Name, n, formatSlotCounts(final), len(ivs), w.tablesSeen(), e.restartCounts())
}

func TestSlotMode(t *testing.T) {
	SlotModeSpec(t, SlotModeInput{Instances: 3, Objects: 30, Slots: 64, MaxControlWrites: 12,
		LeaseDuration: 5 * time.Second, Timeout: 60 * time.Second})
}

// slotWatch follows a slot ring: every version of the ring (its slot table,
// checked as it arrives), the EtcdClusters' slot labels and writes, and the
// writes of the instance Leases' metadata.
type slotWatch struct {
	e     *ringEnv
	count int
	spec  sharderv1alpha1.ControllerRingSpec

	mu   sync.Mutex
	objs map[string]*slotObject
	// objWrites are the EtcdClusters' updates after their slot label was
	// first seen.
	objWrites []write
	// ringVersions are the ring's versions, as the watch saw them.
	ringVersions []ringVersion
	leaseMeta    map[string]string
	leaseLog     []write
	bad          []string
	changed      chan struct{}
}

type slotObject struct {
	key  string
	slot int // -1: no slot label yet
	rv   string
	meta string // labels, annotations, finalizers
}

type write struct {
	at   time.Time
	what string
	// ownStatus: a write of an object's status by the operator, changing
	// none of its metadata.
	ownStatus bool
}

// operatorFieldManager is the field manager of the example operator's
// writes (its binary's name).
const operatorFieldManager = "etcd-operator"

func (w write) String() string { return w.at.Format(time.StampMilli) + " " + w.what }

type ringVersion struct {
	at    time.Time
	rv    string
	table slots.Table
}

func newSlotWatch(e *ringEnv, count int) *slotWatch {
	e.t.Helper()
	w := &slotWatch{e: e, count: count, objs: map[string]*slotObject{}, leaseMeta: map[string]string{}, changed: make(chan struct{})}
	var r sharderv1alpha1.ControllerRing
	e.g.Expect(e.c.Get(e.ctx, client.ObjectKey{Name: e.ring}, &r)).To(gomega.Succeed())
	e.g.Expect(r.Spec.AssignsSlots()).To(gomega.BeTrue())
	w.spec = r.Spec

	mc, err := metadata.NewForConfig(cluster.ControlPlane.Config)
	e.g.Expect(err).NotTo(gomega.HaveOccurred())
	start := func(gvr schema.GroupVersionResource, namespace string, observe, forget func(*metav1.PartialObjectMetadata)) {
		inf := metadatainformer.NewFilteredMetadataInformer(mc, gvr, namespace, 0, cache.Indexers{}, nil).Informer()
		_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { observe(obj.(*metav1.PartialObjectMetadata)) },
			UpdateFunc: func(_, obj any) { observe(obj.(*metav1.PartialObjectMetadata)) },
			DeleteFunc: func(obj any) {
				if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
					obj = d.Obj
				}
				if m, ok := obj.(*metav1.PartialObjectMetadata); ok && forget != nil {
					forget(m)
				}
			},
		})
		e.g.Expect(err).NotTo(gomega.HaveOccurred())
		go inf.Run(e.ctx.Done())
		e.g.Expect(cache.WaitForCacheSync(e.ctx.Done(), inf.HasSynced)).To(gomega.BeTrue())
	}
	start(etcdClusters, e.namespace, w.observeObject, w.forgetObject)
	start(schema.GroupVersionResource{Group: "coordination.k8s.io", Version: "v1", Resource: "leases"}, e.leaseNamespace, w.observeLease, nil)

	wc, err := client.NewWithWatch(cluster.ControlPlane.Config, client.Options{Scheme: e.c.Scheme()})
	e.g.Expect(err).NotTo(gomega.HaveOccurred())
	go func() {
		for e.ctx.Err() == nil {
			watch, err := wc.Watch(e.ctx, &sharderv1alpha1.ControllerRingList{}, client.MatchingFields{"metadata.name": e.ring})
			if err != nil {
				select {
				case <-e.ctx.Done():
				case <-time.After(200 * time.Millisecond):
				}
				continue
			}
			for ev := range watch.ResultChan() {
				if r, ok := ev.Object.(*sharderv1alpha1.ControllerRing); ok {
					w.observeRing(r)
				}
			}
			watch.Stop()
		}
	}()
	return w
}

// notify wakes the waits; w.mu held.
func (w *slotWatch) notify() {
	close(w.changed)
	w.changed = make(chan struct{})
}

// forgetObject drops a deleted EtcdCluster: the objects a wait counts are
// those that exist.
func (w *slotWatch) forgetObject(m *metav1.PartialObjectMetadata) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.objs, m.Namespace+"/"+m.Name)
	w.notify()
}

func (w *slotWatch) observeObject(m *metav1.PartialObjectMetadata) {
	key := m.Namespace + "/" + m.Name
	slot := -1
	if v, ok := m.Labels[sharderv1alpha1.SlotLabel(w.e.ring)]; ok {
		s, err := slots.ParseLabel(v, w.count)
		if err != nil {
			w.mu.Lock()
			w.bad = append(w.bad, fmt.Sprintf("%s: slot label %q: %v", key, v, err))
			w.mu.Unlock()
		} else {
			slot = s
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	o := w.objs[key]
	if o == nil {
		o = &slotObject{key: key, slot: -1}
		w.objs[key] = o
	}
	meta := fmt.Sprint(m.Labels, m.Annotations, m.Finalizers)
	if o.rv != "" && o.rv != m.ResourceVersion && o.slot >= 0 {
		writer := lastWriter(m)
		x := write{at: time.Now(), what: key + " by " + writer}
		if meta != o.meta {
			x.what += fmt.Sprintf(" (metadata %s → %s)", o.meta, meta)
		}
		// The operator's reconciles write their clusters' status as they
		// see them change (no kubelet runs their pods here): the
		// operator's business, not the assignment's.
		x.ownStatus = meta == o.meta && writer == operatorFieldManager+"/status"
		w.objWrites = append(w.objWrites, x)
	}
	o.meta = meta
	if o.slot >= 0 && slot != o.slot {
		w.bad = append(w.bad, fmt.Sprintf("%s: slot label changed from %d to %d", key, o.slot, slot))
	}
	o.rv, o.slot = m.ResourceVersion, slot
	w.notify()
}

// lastWriter names the field manager (and subresource) of the latest entry
// of an object's managed fields: who wrote it last, to the second.
func lastWriter(m *metav1.PartialObjectMetadata) string {
	var last *metav1.ManagedFieldsEntry
	for i := range m.ManagedFields {
		f := &m.ManagedFields[i]
		if f.Time != nil && (last == nil || !f.Time.Before(last.Time)) {
			last = f
		}
	}
	if last == nil {
		return "?"
	}
	if last.Subresource != "" {
		return last.Manager + "/" + last.Subresource
	}
	return last.Manager
}

// observeLease records the writes of a Lease's labels and annotations (the
// sharder's state labels, the instances' acknowledgements) and its
// creation; renewals, which write the spec only, are not counted.
func (w *slotWatch) observeLease(m *metav1.PartialObjectMetadata) {
	meta := fmt.Sprint(m.Labels, m.Annotations)
	w.mu.Lock()
	defer w.mu.Unlock()
	prev, seen := w.leaseMeta[m.Name]
	switch {
	case !seen:
		w.leaseLog = append(w.leaseLog, write{at: time.Now(), what: m.Name + " created"})
	case prev != meta:
		w.leaseLog = append(w.leaseLog, write{at: time.Now(), what: m.Name + " " + meta})
	}
	w.leaseMeta[m.Name] = meta
}

// observeRing records a version of the ring and checks its table: it
// parses (no slot listed twice, none out of range), and its revision is
// above the last one's when it changed.
func (w *slotWatch) observeRing(r *sharderv1alpha1.ControllerRing) {
	tb, err := slots.FromStatus(w.count, r.Status.Slots)
	w.mu.Lock()
	defer w.mu.Unlock()
	if n := len(w.ringVersions); n > 0 && w.ringVersions[n-1].rv == r.ResourceVersion {
		return
	}
	if err != nil {
		w.bad = append(w.bad, fmt.Sprintf("ring version %s: %v", r.ResourceVersion, err))
		return
	}
	if n := len(w.ringVersions); n > 0 {
		last := w.ringVersions[n-1].table
		switch {
		case tb.Revision < last.Revision:
			w.bad = append(w.bad, fmt.Sprintf("ring version %s: table revision %d after %d", r.ResourceVersion, tb.Revision, last.Revision))
		case tb.Revision == last.Revision && !slices.Equal(tb.Slots, last.Slots):
			w.bad = append(w.bad, fmt.Sprintf("ring version %s: table changed under revision %d", r.ResourceVersion, tb.Revision))
		}
	}
	w.ringVersions = append(w.ringVersions, ringVersion{at: time.Now(), rv: r.ResourceVersion, table: tb})
	w.notify()
}

func (w *slotWatch) table() slots.Table {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.ringVersions) == 0 {
		return slots.NewTable(w.count)
	}
	return w.ringVersions[len(w.ringVersions)-1].table
}

func (w *slotWatch) tablesSeen() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.ringVersions)
}

func (w *slotWatch) violations() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.bad)
}

// slotObjectState is an object with its slot's holder in the latest table.
type slotObjectState struct {
	key    string
	slot   int
	holder string
}

func (w *slotWatch) objects() []slotObjectState {
	tb := w.table()
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]slotObjectState, 0, len(w.objs))
	for _, o := range w.objs {
		s := slotObjectState{key: o.key, slot: o.slot}
		if o.slot >= 0 {
			s.holder = tb.Slots[o.slot].Holder
		}
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b slotObjectState) int { return strings.Compare(a.key, b.key) })
	return out
}

func since(ws []write, from, to time.Time) []write {
	var out []write
	for _, x := range ws {
		if !x.at.Before(from) && !x.at.After(to) {
			out = append(out, x)
		}
	}
	return out
}

func (w *slotWatch) objectWrites(from, to time.Time) []write {
	w.mu.Lock()
	defer w.mu.Unlock()
	return since(w.objWrites, from, to)
}

func (w *slotWatch) leaseWrites(from, to time.Time) []write {
	w.mu.Lock()
	defer w.mu.Unlock()
	return since(w.leaseLog, from, to)
}

// ringWrites returns the ring's versions seen between from and to, each
// described by its table.
func (w *slotWatch) ringWrites(from, to time.Time) []write {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []write
	for _, v := range w.ringVersions {
		if !v.at.Before(from) && !v.at.After(to) {
			out = append(out, write{at: v.at, what: fmt.Sprintf("revision %d", v.table.Revision)})
		}
	}
	return out
}

// firstMove returns when a table seen from from on first showed one of ss
// with another holder than holder.
func (w *slotWatch) firstMove(from time.Time, ss []int, holder string) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, v := range w.ringVersions {
		if v.at.Before(from) {
			continue
		}
		for _, s := range ss {
			if v.table.Slots[s].Holder != holder {
				return v.at
			}
		}
	}
	return time.Time{}
}

// firstGrant returns when a table seen from from on first granted holder a
// slot.
func (w *slotWatch) firstGrant(from time.Time, holder string) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, v := range w.ringVersions {
		if v.at.Before(from) {
			continue
		}
		if slices.ContainsFunc(v.table.Slots, func(s slots.Slot) bool { return s.Holder == holder && !s.Releasing }) {
			return v.at
		}
	}
	return time.Time{}
}

// slotAssignment is a settled ring: the holder of every slot, the objects
// per instance, the table's revision.
type slotAssignment struct {
	revision int64
	holders  []string
	counts   map[string]int
}

func formatSlotCounts(a slotAssignment) string {
	slotsOf := map[string]int{}
	for _, h := range a.holders {
		slotsOf[h]++
	}
	var parts []string
	for _, id := range slices.Sorted(maps.Keys(slotsOf)) {
		parts = append(parts, fmt.Sprintf("%s: %d slots, %d objects", id, slotsOf[id], a.counts[id]))
	}
	return strings.Join(parts, "; ")
}

// waitSettled waits until n EtcdClusters carry the slot label of their key,
// every slot is granted (none releasing, none unassigned) to one of
// instances, each holding its share to within one slot.
func (w *slotWatch) waitSettled(n int, timeout time.Duration, instances ...string) slotAssignment {
	w.e.t.Helper()
	var out slotAssignment
	err := localrunPoll(w.e.ctx, timeout, w, func() error {
		tb := w.table()
		objs := w.objects()
		if len(objs) != n {
			return fmt.Errorf("%d objects seen, want %d", len(objs), n)
		}
		held := map[string]int{}
		for s, sl := range tb.Slots {
			switch {
			case sl.Holder == "":
				return fmt.Errorf("slot %d unassigned (revision %d)", s, tb.Revision)
			case sl.Releasing:
				return fmt.Errorf("slot %d releasing from %s (revision %d)", s, sl.Holder, tb.Revision)
			case !slices.Contains(instances, sl.Holder):
				return fmt.Errorf("slot %d granted to %s, not one of %v (revision %d)", s, sl.Holder, instances, tb.Revision)
			}
			held[sl.Holder]++
		}
		lo, hi := w.count/len(instances), (w.count+len(instances)-1)/len(instances)
		for _, id := range instances {
			if held[id] < lo || held[id] > hi {
				return fmt.Errorf("%s holds %d slots, want %d to %d (revision %d)", id, held[id], lo, hi, tb.Revision)
			}
		}
		counts := map[string]int{}
		for _, o := range objs {
			ns, name, _ := strings.Cut(o.key, "/")
			want := slots.ForMainObject(&w.spec, etcdClusterKind.Group, etcdClusterKind.Kind, ns, name)
			if o.slot != want {
				return fmt.Errorf("%s has slot %d, want %d", o.key, o.slot, want)
			}
			counts[o.holder]++
		}
		out = slotAssignment{revision: tb.Revision, holders: tb.Holders(), counts: counts}
		return nil
	})
	if err != nil {
		w.e.t.Fatalf("slot ring %s did not settle on %v within %s: %v", w.e.ring, instances, timeout, err)
	}
	return out
}

// localrunPoll checks cond after each change the watch sees (and every
// 250 ms) until it holds or timeout passes.
func localrunPoll(ctx context.Context, timeout time.Duration, w *slotWatch, cond func() error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		w.mu.Lock()
		ch := w.changed
		w.mu.Unlock()
		err := cond()
		if err == nil {
			return nil
		}
		select {
		case <-ch:
		case <-time.After(250 * time.Millisecond):
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", ctx.Err(), err)
		}
	}
}

// expectReconciledByHolder waits until every EtcdCluster has last been
// reconciled, successfully and to the end, by the instance its slot is
// granted to, and returns when each such last reconcile started.
func (w *slotWatch) expectReconciledByHolder(timeout time.Duration) map[string]time.Time {
	w.e.t.Helper()
	starts := map[string]time.Time{}
	w.e.g.Eventually(func() error {
		last := reconcilelog.LastReconcile(w.e.intervals())
		var bad []string
		for _, o := range w.objects() {
			iv, ok := last[o.key]
			switch {
			case o.holder == "":
				bad = append(bad, o.key+" has no holder")
			case !ok:
				bad = append(bad, o.key+" never reconciled")
			case iv.Instance != o.holder:
				bad = append(bad, fmt.Sprintf("%s (slot %d) last reconciled by %s, its slot is granted to %s", o.key, o.slot, iv.Instance, o.holder))
			case iv.Open:
				bad = append(bad, o.key+": reconcile still running")
			case iv.Error != "":
				bad = append(bad, fmt.Sprintf("%s: last reconcile failed: %s", o.key, iv.Error))
			default:
				starts[o.key] = iv.Start
			}
		}
		if len(bad) > 0 {
			return fmt.Errorf("%d objects not reconciled by their slot's holder: %s", len(bad), strings.Join(bad[:min(len(bad), 5)], "; "))
		}
		return nil
	}).WithTimeout(timeout).WithPolling(250 * time.Millisecond).Should(gomega.Succeed())
	return starts
}
