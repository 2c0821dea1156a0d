package membership

import (
	"fmt"
	"slices"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// This file is the one writer of instance Leases. The instance's holder and
// the sharder (its lease controller and its slot table's fence) build every
// version they write here, so that the protocol's rules live in one place:
// when acquireTime moves, when leaseTransitions counts, which duration a
// takeover writes, and which labels, annotations and owner references belong
// on a Lease in which state (docs/design.md §1, §3, §11). Each operation
// returns a deep copy to write and never changes the Lease it is given,
// which is usually a cached object.

// Record is the holder record of an instance Lease: its spec, as the
// protocol reads it. Absent fields read as zero values. RecordOf and
// Record.writeTo are the one pair of conversions between the two, as
// client-go's leader election keeps one for its own record.
type Record struct {
	// Holder is spec.holderIdentity: the instance ID while the instance
	// holds its Lease, a sharder's identity while a sharder holds it, empty
	// once released.
	Holder string
	// DurationSeconds is spec.leaseDurationSeconds as written (DurationOf
	// interprets it).
	DurationSeconds int32
	// AcquireTime is spec.acquireTime: when the current holder acquired the
	// Lease.
	AcquireTime time.Time
	// RenewTime is spec.renewTime: when the holder last wrote it.
	RenewTime time.Time
	// Transitions is spec.leaseTransitions: how often the holder changed.
	Transitions int32
}

// RecordOf returns the record of lease.
func RecordOf(lease *coordinationv1.Lease) Record {
	s := &lease.Spec
	r := Record{
		Holder:          ptr.Deref(s.HolderIdentity, ""),
		DurationSeconds: ptr.Deref(s.LeaseDurationSeconds, 0),
		Transitions:     ptr.Deref(s.LeaseTransitions, 0),
	}
	if s.AcquireTime != nil {
		r.AcquireTime = s.AcquireTime.Time
	}
	if s.RenewTime != nil {
		r.RenewTime = s.RenewTime.Time
	}
	return r
}

// writeTo writes r into spec. Every write names its holder and its renewal;
// the other fields are written only when they differ from what spec says,
// so that a field a write keeps stays exactly as it was on the wire (an
// absent count stays absent rather than becoming 0). The fields of the spec
// the record does not know (strategy, preferredHolder) are kept.
func (r Record) writeTo(spec *coordinationv1.LeaseSpec) {
	old := RecordOf(&coordinationv1.Lease{Spec: *spec})
	spec.HolderIdentity = ptr.To(r.Holder)
	spec.RenewTime = microTime(r.RenewTime)
	if r.DurationSeconds != old.DurationSeconds {
		spec.LeaseDurationSeconds = ptr.To(r.DurationSeconds)
	}
	if !r.AcquireTime.Equal(old.AcquireTime) {
		spec.AcquireTime = microTime(r.AcquireTime)
	}
	if r.Transitions != old.Transitions {
		spec.LeaseTransitions = ptr.To(r.Transitions)
	}
}

// microTime returns t as a Lease stamp, nil for the zero time.
func microTime(t time.Time) *metav1.MicroTime {
	if t.IsZero() {
		return nil
	}
	return ptr.To(metav1.NewMicroTime(t))
}

// acquiredBy returns r acquired by holder at now: a new hold, with
// acquireTime now and one more transition (NextTransition).
func (r Record) acquiredBy(holder string, now time.Time) Record {
	r.Holder, r.AcquireTime, r.RenewTime = holder, now, now
	r.Transitions = NextTransition(r.Transitions)
	return r
}

// Holding is what an instance writes on its Lease while it holds it,
// besides the record: the Lease is named after the instance and lives in
// the ring's lease namespace.
type Holding struct {
	// Identity is the instance ID: the Lease's name and its holder.
	Identity string
	// Namespace is the ring's lease namespace.
	Namespace string
	// Ring is the value of the sharder.dev/ring label.
	Ring string
	// Duration is the lease duration written (whole seconds).
	Duration time.Duration
	// VirtualNodes is the sharder.dev/virtual-nodes label; 0 removes it (the
	// ring's default applies).
	VirtualNodes int
	// MaxWatchLag is the sharder.dev/max-watch-lag annotation; 0 removes it
	// (no promise).
	MaxWatchLag time.Duration
	// MaxStop is the sharder.dev/max-stop annotation; 0 removes it (no
	// promise beyond the Lease's margin).
	MaxStop time.Duration
	// Pod, when set, is put first among the Lease's owner references in
	// place of any other Pod, so that garbage collection deletes the Lease
	// with the instance's pod.
	Pod *metav1.OwnerReference
	// Annotations are further annotations the instance asked for (the slot
	// acknowledgement, sharder.dev/slots-acknowledged), written last. A
	// release keeps them.
	Annotations map[string]string
}

// Acquire returns base as the instance writes it to start a hold: its
// metadata (Holding), holder the instance, renewed and acquired at now, and
// one more transition when base had another, non-empty holder. A released
// Lease (empty holder) changes hands without a transition: the count is of
// holders who lost the Lease to another, as the instance has always written
// it. base may be an empty Lease, for a create.
func (h Holding) Acquire(base *coordinationv1.Lease, now time.Time) *coordinationv1.Lease {
	return h.write(base, now, true)
}

// Renew returns base as the instance writes it to renew its hold: as
// Acquire, but acquireTime and leaseTransitions stay as they are (a Lease
// without an acquireTime is acquired instead).
func (h Holding) Renew(base *coordinationv1.Lease, now time.Time) *coordinationv1.Lease {
	return h.write(base, now, false)
}

// write is Acquire (acquire true) and Renew.
//
// It drops the annotations that only a Lease the instance does not hold
// means anything by, with every write: sharder.dev/restarting, and
// sharder.dev/fenced, the sharder's fence, which is over once the instance
// holds its Lease again (it acquires it only after the sharder released it
// or let its takeover expire, after the fence's wait; the sharder keeps a
// fence it took through its wait whatever the Lease shows). Left behind,
// the fence would make the sharder wait out a fence again when the instance
// next releases or loses its Lease.
func (h Holding) write(base *coordinationv1.Lease, now time.Time, acquire bool) *coordinationv1.Lease {
	l := base.DeepCopy()
	l.Name, l.Namespace = h.Identity, h.Namespace
	setLabel(l, v1alpha1.LabelRing, h.Ring)
	delete(l.Annotations, v1alpha1.AnnotationRestarting)
	delete(l.Annotations, v1alpha1.AnnotationFenced)
	if h.VirtualNodes > 0 {
		setLabel(l, v1alpha1.LabelVirtualNodes, fmt.Sprint(h.VirtualNodes))
	} else {
		delete(l.Labels, v1alpha1.LabelVirtualNodes)
	}
	setDuration(l, v1alpha1.AnnotationMaxWatchLag, h.MaxWatchLag)
	setDuration(l, v1alpha1.AnnotationMaxStop, h.MaxStop)
	if h.Pod != nil {
		l.OwnerReferences = append([]metav1.OwnerReference{*h.Pod}, slices.DeleteFunc(slices.Clone(l.OwnerReferences), isPodOwner)...)
	}

	r := RecordOf(l)
	if acquire || l.Spec.AcquireTime == nil {
		if r.Holder != "" && r.Holder != h.Identity {
			r.Transitions = NextTransition(r.Transitions)
		}
		r.AcquireTime = now
	}
	r.Holder, r.RenewTime = h.Identity, now
	r.DurationSeconds = int32(h.Duration / time.Second) //nolint:gosec // at most MaxLeaseDuration
	r.writeTo(&l.Spec)

	for k, v := range h.Annotations {
		setAnnotation(l, k, v)
	}
	return l
}

// Release returns lease handed back by the instance at now: no holder,
// renewTime now, its metadata kept. With restart it carries the
// sharder.dev/restarting annotation and no Pod owner when the holding sets
// one: the pod is deleted and created again with the same name, and
// garbage collection must not take the Lease with the old pod, or the next
// process would find none and wait a lease duration to create it (it sets
// its own pod as the owner).
func (h Holding) Release(lease *coordinationv1.Lease, now time.Time, restart bool) *coordinationv1.Lease {
	released := Release(lease, now)
	if restart {
		setAnnotation(released, v1alpha1.AnnotationRestarting, "true")
		if h.Pod != nil {
			released.OwnerReferences = slices.DeleteFunc(released.OwnerReferences, isPodOwner)
		}
	}
	return released
}

// Release returns lease released for good at now: no holder, renewTime
// now, everything else kept. The instance releases its Lease so on a stop
// (Holding.Release), the sharder its hold of a dead instance's Lease once
// no move can happen; whoever comes next acquires a released Lease at once.
func Release(lease *coordinationv1.Lease, now time.Time) *coordinationv1.Lease {
	released := lease.DeepCopy()
	r := RecordOf(released)
	r.Holder, r.RenewTime = "", now
	r.writeTo(&released.Spec)
	return released
}

// Take returns lease taken by the sharder holder at now, the takeover of an
// uncertain Lease (docs/design.md §3): holder the sharder, acquired and
// renewed at now, one more transition, and TakeoverFactor times the Lease's
// duration, so that the instance, which acquires a Lease someone else holds
// only after watching it unrenewed for its duration, keeps away for twice
// as long as it promised to stop within.
func Take(lease *coordinationv1.Lease, holder string, now time.Time) *coordinationv1.Lease {
	taken := lease.DeepCopy()
	r := RecordOf(taken).acquiredBy(holder, now)
	r.DurationSeconds = int32(TakeoverFactor * DurationOf(lease) / time.Second) //nolint:gosec // at most 2 × MaxLeaseDuration
	r.writeTo(&taken.Spec)
	return taken
}

// Fence returns lease taken by the sharder holder at now to fence the
// instance (docs/design.md §11): a takeover as Take, with the annotation
// sharder.dev/fenced, which tells a new sharder leader to wait out the fence
// before it grants the instance's slots to others.
func Fence(lease *coordinationv1.Lease, holder string, now time.Time) *coordinationv1.Lease {
	fenced := Take(lease, holder, now)
	setAnnotation(fenced, v1alpha1.AnnotationFenced, "true")
	return fenced
}

// Fenced reports whether lease carries a fence in force: the
// sharder.dev/fenced annotation, and a holder other than the instance (the
// sharder's takeover or hold, or released after them). The instance removes
// the annotation when it acquires its Lease again.
func Fenced(lease *coordinationv1.Lease) bool {
	return lease.Annotations[v1alpha1.AnnotationFenced] == "true" && ptr.Deref(lease.Spec.HolderIdentity, "") != lease.Name
}

// Hold returns the Lease of a dead instance held by the sharder holder at
// now while its objects move (docs/design.md §3): renewed at now with the
// duration it has; acquired at now, with one more transition, when holder
// did not hold it (released, taken by another sharder or by someone else).
// Held, the Lease no longer says the instance is restarting: released again
// later, its instance takes it back as from any stop.
func Hold(lease *coordinationv1.Lease, holder string, now time.Time) *coordinationv1.Lease {
	held := lease.DeepCopy()
	r := RecordOf(held)
	if r.Holder != holder {
		r = r.acquiredBy(holder, now)
	}
	r.Holder, r.RenewTime = holder, now
	r.writeTo(&held.Spec)
	delete(held.Annotations, v1alpha1.AnnotationRestarting)
	return held
}

// NewHeld returns the Lease of instance id of ring, absent from the API
// server, as the sharder holder creates it at now to hold it while the
// instance's objects move: in namespace, labelled for the ring, with
// duration d (whole seconds) and one transition (the instance held it
// before).
func NewHeld(namespace, id, ring, holder string, d time.Duration, now time.Time) *coordinationv1.Lease {
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{
		Namespace: namespace,
		Name:      id,
		Labels:    map[string]string{v1alpha1.LabelRing: ring},
	}}
	heldRecord(holder, d, 1, now).writeTo(&lease.Spec)
	return lease
}

// HoldInRing returns current, an instance's Lease that lost its
// sharder.dev/ring label, labelled for ring again and held by the sharder
// holder at now with duration d (whole seconds), as NewHeld would create it
// but counting one more transition than current did. The spec is the
// sharder's alone (the instance's restarting annotation goes too): the
// Lease is taken, not renewed.
func HoldInRing(current *coordinationv1.Lease, ring, holder string, d time.Duration, now time.Time) *coordinationv1.Lease {
	taken := current.DeepCopy()
	setLabel(taken, v1alpha1.LabelRing, ring)
	delete(taken.Annotations, v1alpha1.AnnotationRestarting)
	taken.Spec = coordinationv1.LeaseSpec{}
	heldRecord(holder, d, NextTransition(ptr.Deref(current.Spec.LeaseTransitions, 0)), now).writeTo(&taken.Spec)
	return taken
}

// heldRecord is the record of a Lease the sharder holder acquired at now
// with duration d and transitions changes of holder so far.
func heldRecord(holder string, d time.Duration, transitions int32, now time.Time) Record {
	return Record{
		Holder:          holder,
		DurationSeconds: int32(d / time.Second), //nolint:gosec // a duration read from a Lease, or the default
		AcquireTime:     now,
		RenewTime:       now,
		Transitions:     transitions,
	}
}

// WithState returns lease with the sharder.dev/state label the sharder
// writes for people set to state, or removed when state is empty.
func WithState(lease *coordinationv1.Lease, state State) *coordinationv1.Lease {
	labelled := lease.DeepCopy()
	if state == "" {
		delete(labelled.Labels, v1alpha1.LabelState)
	} else {
		setLabel(labelled, v1alpha1.LabelState, string(state))
	}
	return labelled
}

// isPodOwner reports whether ref names a Pod: the owner an instance's
// holder sets on its Lease (Holding.Pod).
func isPodOwner(ref metav1.OwnerReference) bool { return ref.Kind == "Pod" && ref.APIVersion == "v1" }

// setLabel sets a label on l, creating the map when needed.
func setLabel(l *coordinationv1.Lease, key, value string) {
	if l.Labels == nil {
		l.Labels = map[string]string{}
	}
	l.Labels[key] = value
}

// setAnnotation sets an annotation on l, creating the map when needed.
func setAnnotation(l *coordinationv1.Lease, key, value string) {
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[key] = value
}

// setDuration sets the annotation key to d as a Go duration, or removes it
// when d is not positive.
func setDuration(l *coordinationv1.Lease, key string, d time.Duration) {
	if d > 0 {
		setAnnotation(l, key, d.String())
	} else {
		delete(l.Annotations, key)
	}
}
