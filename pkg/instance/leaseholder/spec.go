package leaseholder

import (
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/sharder-dev/sharder/pkg/membership"
)

// This file holds the pure functions of the holder: what it writes on its
// Lease, computed from its options (the Leases themselves are built by
// membership.Holding), and the comparisons that tell its own writes from
// others'.

// holding returns what this holder writes on its Lease while holding it
// (membership.Holding): its name, ring and weight labels, its watch-lag
// promise (only when its client can watch the Lease, which proves the
// watch), its stop promise, its Pod as owner, its lease duration, and the
// annotations asked for with Annotate so far (extra). Every version of the
// Lease the holder writes is built from it by the membership package.
func (o *Options) holding(extra map[string]string) membership.Holding {
	h := membership.Holding{
		Identity:     o.Identity,
		Namespace:    o.Namespace,
		Ring:         o.Ring,
		Duration:     o.LeaseDuration,
		VirtualNodes: o.VirtualNodes,
		MaxStop:      o.StopTimeout,
		Pod:          o.Pod,
		Annotations:  extra,
	}
	if o.watching {
		h.MaxWatchLag = o.MaxWatchLag
	}
	return h
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
