package membership

import (
	"fmt"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
)

// BenchmarkTrackerMembers measures one publication of a ring of 1,000
// ready instances (Members, as the lease controller computes it after
// every membership change), and BenchmarkTrackerReady one admission's
// question for one instance.
func BenchmarkTrackerMembers(b *testing.B) {
	var tr Tracker
	leases := make([]coordinationv1.Lease, 1000)
	for i := range leases {
		id := fmt.Sprintf("instance-%04d", i)
		leases[i] = *instanceLease(id, id, epoch, 15)
	}
	tr.Members("r", 0, leases, epoch)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		tr.Members("r", 0, leases, epoch.Add(time.Duration(i%1000)*time.Millisecond))
	}
}

func BenchmarkTrackerReady(b *testing.B) {
	var tr Tracker
	tr.Observe("r", 0, instanceLease("instance-0001", "instance-0001", epoch, 15), epoch)
	b.ReportAllocs()
	for b.Loop() {
		tr.Ready("r", "instance-0001", epoch)
	}
}
