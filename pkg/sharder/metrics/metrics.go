package metrics

import "github.com/prometheus/client_golang/prometheus"

// Label names shared by the assignment metrics.
const (
	LabelRing  = "ring"
	LabelState = "state"
	// LabelInstance names a ring's instance. It is not "instance", which
	// Prometheus gives every scraped series (the target's address): a
	// metric of that name would replace it, or be renamed exported_instance.
	LabelInstance = "ring_instance"
	LabelReason   = "reason"
	LabelOutcome  = "outcome"
	// LabelDrainAcknowledgements says whether a ring's instances may
	// acknowledge drains (label of RingInfo).
	LabelDrainAcknowledgements = "drain_acknowledgements"
)

// Values of LabelDrainAcknowledgements.
const (
	// AcknowledgementsExpected: the ring names instanceServiceAccounts, whom
	// the webhook lets acknowledge drains; a forced move means an instance
	// did not acknowledge within the ring's drainTimeout.
	AcknowledgementsExpected = "expected"
	// AcknowledgementsNone: the ring names no instanceServiceAccounts, so no
	// instance may acknowledge (instances run by sharder agent need none):
	// every move away from a running instance is forced, by design.
	AcknowledgementsNone = "none"
)

// Reasons of a move (label "reason" of MovesTotal).
const (
	// MoveRebalance: the object left a ready instance that acknowledged the drain.
	MoveRebalance = "rebalance"
	// MoveDead: the object left a dead (released or taken) instance at once.
	MoveDead = "dead"
	// MoveForced: the drain was not acknowledged within the ring's drainTimeout.
	MoveForced = "forced"
)

// Outcomes of a drain (label "outcome" of DrainDuration).
const (
	DrainAcknowledged = "acknowledged"
	DrainForced       = "forced"
)

var (
	// RingInfo is 1 for every ring the leader knows, labelled with what of
	// its spec the alerts need: whether its forced moves are by design.
	RingInfo = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "sharder_ring_info",
		Help: "Always 1, per ring: drain_acknowledgements is expected when the ring names instanceServiceAccounts (a forced move is an instance that did not acknowledge), none when it names none (every move away from a running instance is forced, e.g. instances run by sharder agent).",
	}, []string{LabelRing, LabelDrainAcknowledgements})

	// Instances is the number of instances of a ring per Lease state.
	Instances = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "sharder_ring_instances",
		Help: "Instances of a ring by state (ready, restarting, expired, uncertain, vanished, dead, orphaned, invalid).",
	}, []string{LabelRing, LabelState})

	// Objects is the number of main objects assigned to each instance of a
	// ring, as seen in the sharder's caches.
	Objects = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "sharder_ring_objects",
		Help: "Main objects of a ring assigned to each instance.",
	}, []string{LabelRing, LabelInstance})

	// UnassignedObjects is the number of main objects of a ring without a
	// shard label.
	UnassignedObjects = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "sharder_ring_unassigned_objects",
		Help: "Main objects of a ring carrying no shard label.",
	}, []string{LabelRing})

	// AssignmentsTotal counts shard labels written on unassigned main
	// objects that were not being moved: new objects, and objects whose
	// label was removed other than by a drain acknowledgement. The end of a
	// move is counted once, in MovesTotal, never here.
	AssignmentsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sharder_assignments_total",
		Help: "Unassigned main objects labelled with their instance (moves not included: see sharder_moves_total).",
	}, []string{LabelRing})

	// MovesTotal counts main objects that reached a new instance, by reason
	// (rebalance, dead, forced).
	MovesTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sharder_moves_total",
		Help: "Main objects moved to another instance, by reason (rebalance, dead, forced).",
	}, []string{LabelRing, LabelReason})

	// DrainsTotal counts drain labels the sharder set.
	DrainsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sharder_drains_total",
		Help: "Drain requests written (drain label set on an object of a ready instance).",
	}, []string{LabelRing})

	// DrainsInFlight is the number of main objects of a ring carrying the
	// drain label.
	DrainsInFlight = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "sharder_drains_in_flight",
		Help: "Main objects of a ring carrying the drain label.",
	}, []string{LabelRing})

	// DrainDuration is the time from a drain request (or from the sharder
	// first seeing the drain label) to its end, by outcome.
	DrainDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "sharder_drain_duration_seconds",
		Help:    "Time from drain request to acknowledgement or forced move, by outcome (acknowledged, forced).",
		Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300},
	}, []string{LabelRing, LabelOutcome})

	// AssignmentLatency is the time from the sharder seeing an unassigned
	// main object to its shard label being written.
	AssignmentLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "sharder_assignment_latency_seconds",
		Help:    "Time from the sharder seeing an unassigned object to its shard label being written.",
		Buckets: []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10},
	}, []string{LabelRing})

	// RingRebuildsTotal counts rebuilds of a ring's lookup structure (on
	// membership or configuration changes, never per object).
	RingRebuildsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sharder_ring_rebuilds_total",
		Help: "Rebuilds of a ring after a membership or configuration change.",
	}, []string{LabelRing})
)

// SetRingInfo records ring in RingInfo, replacing what was recorded for it
// before: acknowledged reports whether the ring names instanceServiceAccounts.
// The ring is never without a series: a scrape in between sees both.
func SetRingInfo(ring string, acknowledged bool) {
	value, other := AcknowledgementsNone, AcknowledgementsExpected
	if acknowledged {
		value, other = other, value
	}
	RingInfo.WithLabelValues(ring, value).Set(1)
	RingInfo.DeleteLabelValues(ring, other)
	initCounters(ring)
}

// initCounters creates the ring's counter series at 0 before anything is
// counted. Prometheus's increase() and rate() see a series only from its
// first sample, so a counter born at its first event would hide that event:
// a ring's first forced moves would never fire SharderForcedMoves.
func initCounters(ring string) {
	for _, reason := range []string{MoveRebalance, MoveDead, MoveForced} {
		MovesTotal.WithLabelValues(ring, reason).Add(0)
	}
	AssignmentsTotal.WithLabelValues(ring).Add(0)
	DrainsTotal.WithLabelValues(ring).Add(0)
}

// CountRingRebuild counts a build of ring in RingRebuildsTotal: the Built
// hook of the ringbuilds.Builds a sharder builds its rings with.
func CountRingRebuild(ring string) { RingRebuildsTotal.WithLabelValues(ring).Inc() }

// ForgetRing deletes every assignment series of ring, so a deleted ring
// leaves no stale gauges behind.
func ForgetRing(ring string) {
	match := prometheus.Labels{LabelRing: ring}
	RingInfo.DeletePartialMatch(match)
	Instances.DeletePartialMatch(match)
	Objects.DeletePartialMatch(match)
	UnassignedObjects.DeletePartialMatch(match)
	AssignmentsTotal.DeletePartialMatch(match)
	MovesTotal.DeletePartialMatch(match)
	DrainsTotal.DeletePartialMatch(match)
	DrainsInFlight.DeletePartialMatch(match)
	DrainDuration.DeletePartialMatch(match)
	AssignmentLatency.DeletePartialMatch(match)
	RingRebuildsTotal.DeletePartialMatch(match)
}
