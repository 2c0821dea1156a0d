package metrics

import "github.com/prometheus/client_golang/prometheus"

var (
	// LeaseTransitionsTotal counts the state changes of instance Leases the
	// lease controller recorded, by ring and the state entered.
	LeaseTransitionsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sharder_lease_transitions_total",
		Help: "State changes of instance Leases by ring and the state entered (ready, restarting, expired, uncertain, dead).",
	}, []string{LabelRing, LabelState})

	// LeaseTakeoversTotal counts the uncertain Leases the sharder took: each
	// is an instance declared dead after it stopped renewing.
	LeaseTakeoversTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sharder_lease_takeovers_total",
		Help: "Instance Leases the sharder took after they were not renewed for twice their duration (instances declared dead), by ring.",
	}, []string{LabelRing})

	// LeasesDeletedTotal counts the orphaned Leases the sharder deleted.
	LeasesDeletedTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sharder_leases_deleted_total",
		Help: "Orphaned instance Leases the sharder deleted, by ring.",
	}, []string{LabelRing})
)

// ForgetLeaseRing deletes the Lease series of a deleted ring.
func ForgetLeaseRing(ring string) {
	match := prometheus.Labels{LabelRing: ring}
	LeaseTransitionsTotal.DeletePartialMatch(match)
	LeaseTakeoversTotal.DeletePartialMatch(match)
	LeasesDeletedTotal.DeletePartialMatch(match)
}
