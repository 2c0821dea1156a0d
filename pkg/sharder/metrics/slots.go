package metrics

import "github.com/prometheus/client_golang/prometheus"

// Reasons of a slot move (label "reason" of SlotMovesTotal).
const (
	// SlotMoveRelease: the slot's old instance acknowledged its release.
	SlotMoveRelease = "release"
	// SlotMoveGone: the slot's old instance was dead (or fenced and waited
	// out); the slot moved without an acknowledgement.
	SlotMoveGone = "gone"
)

var (
	// Slots is the number of slots each instance of a ring of unit Slots
	// holds (granted or releasing).
	Slots = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "sharder_ring_slots",
		Help: "Slots each instance of a ring of unit Slots holds, granted or releasing, as the slot table says.",
	}, []string{LabelRing, LabelInstance})

	// SlotMovesTotal counts slots granted to a new instance, by reason.
	SlotMovesTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sharder_slot_moves_total",
		Help: "Slots of a ring of unit Slots granted to another instance, by reason (release: acknowledged by the old instance; gone: the old instance was dead or fenced).",
	}, []string{LabelRing, LabelReason})

	// SlotFencesTotal counts instances fenced for not acknowledging a
	// release within the ring's drainTimeout.
	SlotFencesTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sharder_slot_fences_total",
		Help: "Instances of a ring of unit Slots whose Lease the sharder took because they did not acknowledge a release within drainTimeout.",
	}, []string{LabelRing})

	// SlotReleaseDuration is the time from the sharder seeing a release
	// written to the grant that answered its acknowledgement.
	SlotReleaseDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "sharder_slot_release_duration_seconds",
		Help:    "Time from a slot's release written to its grant to the new instance after the old one acknowledged.",
		Buckets: []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300},
	}, []string{LabelRing})
)
