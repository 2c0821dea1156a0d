package leaseholder

import (
	"fmt"
	"slices"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
)

// This file holds the pure functions of the holder: the Leases it writes,
// computed from its options, a base version and a time, and the comparisons
// that tell its own writes from others'.

// heldLease returns base as this holder writes it while holding it: its
// name, ring and weight labels, its watch-lag and stop promises, its Pod as owner, and a spec naming
// o.Identity renewed at now. acquire starts a new hold: acquireTime is now,
// and leaseTransitions counts one more change of holder when base had
// another one (membership.NextTransition). A renewal keeps acquireTime.
//
// It drops the annotations that only a Lease the instance does not hold
// means anything by: sharder.dev/restarting, and sharder.dev/fenced, the
// sharder's fence, which is over once the instance holds its Lease again (the
// instance acquires it only after the sharder released it or let its
// takeover expire, after the fence's wait; the sharder keeps a fence it took
// through its wait whatever the Lease shows). Left behind, the fence would
// make the sharder wait out a fence again when the instance next releases or
// loses its Lease.
func (o *HolderOptions) heldLease(base *coordinationv1.Lease, now time.Time, acquire bool) *coordinationv1.Lease {
	l := base.DeepCopy()
	l.Name, l.Namespace = o.Identity, o.Namespace
	if l.Labels == nil {
		l.Labels = map[string]string{}
	}
	l.Labels[v1alpha1.LabelRing] = o.Ring
	delete(l.Annotations, v1alpha1.AnnotationRestarting)
	delete(l.Annotations, v1alpha1.AnnotationFenced)
	if o.VirtualNodes > 0 {
		l.Labels[v1alpha1.LabelVirtualNodes] = fmt.Sprint(o.VirtualNodes)
	} else {
		delete(l.Labels, v1alpha1.LabelVirtualNodes)
	}
	if o.MaxWatchLag > 0 && o.watching {
		if l.Annotations == nil {
			l.Annotations = map[string]string{}
		}
		l.Annotations[v1alpha1.AnnotationMaxWatchLag] = o.MaxWatchLag.String()
	} else {
		delete(l.Annotations, v1alpha1.AnnotationMaxWatchLag)
	}
	if o.MaxStop > 0 {
		if l.Annotations == nil {
			l.Annotations = map[string]string{}
		}
		l.Annotations[v1alpha1.AnnotationMaxStop] = o.MaxStop.String()
	} else {
		delete(l.Annotations, v1alpha1.AnnotationMaxStop)
	}
	if o.Pod != nil {
		l.OwnerReferences = append([]metav1.OwnerReference{*o.Pod}, slices.DeleteFunc(slices.Clone(l.OwnerReferences), isPodRef)...)
	}
	stamp := ptr.To(metav1.NewMicroTime(now))
	if acquire || l.Spec.AcquireTime == nil {
		if previous := ptr.Deref(l.Spec.HolderIdentity, ""); previous != "" && previous != o.Identity {
			l.Spec.LeaseTransitions = ptr.To(membership.NextTransition(ptr.Deref(l.Spec.LeaseTransitions, 0)))
		}
		l.Spec.AcquireTime = stamp
	}
	l.Spec.HolderIdentity = ptr.To(o.Identity)
	l.Spec.LeaseDurationSeconds = ptr.To(int32(o.LeaseDuration / time.Second)) //nolint:gosec // at most MaxLeaseDuration
	l.Spec.RenewTime = stamp
	return l
}

// releasedLease returns current handed back at now: no holder, renewTime
// now. With ReleaseRestart it carries the sharder.dev/restarting annotation
// and no Pod owner: the pod is deleted and created again with the same name,
// and garbage collection must not take the Lease with the old pod, or the
// next process would find none and wait a lease duration to create it (it
// sets its own pod as the owner).
func (o *HolderOptions) releasedLease(current *coordinationv1.Lease, now time.Time) *coordinationv1.Lease {
	released := current.DeepCopy()
	released.Spec.HolderIdentity = ptr.To("")
	released.Spec.RenewTime = ptr.To(metav1.NewMicroTime(now))
	if o.Release == ReleaseRestart {
		if released.Annotations == nil {
			released.Annotations = map[string]string{}
		}
		released.Annotations[v1alpha1.AnnotationRestarting] = "true"
		if o.Pod != nil {
			released.OwnerReferences = slices.DeleteFunc(released.OwnerReferences, isPodRef)
		}
	}
	return released
}

// sameStamps reports whether two specs name the same holder with the same
// renewTime and acquireTime.
func sameStamps(a, b *coordinationv1.LeaseSpec) bool {
	return ptr.Deref(a.HolderIdentity, "") == ptr.Deref(b.HolderIdentity, "") &&
		microEqual(a.RenewTime, b.RenewTime) && microEqual(a.AcquireTime, b.AcquireTime)
}

// microEqual compares two stamps as the API server stores them: to the
// microsecond (a spec remembered before sending still has nanoseconds).
func microEqual(a, b *metav1.MicroTime) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Truncate(time.Microsecond).Equal(b.Truncate(time.Microsecond))
}

// sameRecord reports whether two Lease specs are the same renewal.
func sameRecord(a, b *coordinationv1.LeaseSpec) bool {
	return sameStamps(a, b) && ptr.Deref(a.LeaseDurationSeconds, 0) == ptr.Deref(b.LeaseDurationSeconds, 0)
}

// isPodRef reports whether ref names a Pod.
func isPodRef(ref metav1.OwnerReference) bool { return ref.Kind == "Pod" && ref.APIVersion == "v1" }
