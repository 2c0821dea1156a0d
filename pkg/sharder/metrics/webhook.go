package metrics

import "github.com/prometheus/client_golang/prometheus"

// Label names of the webhook metrics.
const (
	LabelDecision = "decision"
	// LabelAssignResult is the result of the assigning webhook.
	LabelAssignResult = "result"
)

// Decisions of the label-protecting webhook (label "decision").
const (
	WebhookAllowed = "allowed"
	WebhookDenied  = "denied"
	// WebhookFault: the webhook could not decide (caches not synced, an
	// unknown ring, an API error) and applied the ring's failure policy.
	WebhookFault = "fault"
)

var (
	// WebhookDecisionsTotal counts the webhook's answers per ring, decision
	// (allowed, denied, fault) and reason (why it was allowed or denied, or
	// what went wrong).
	WebhookDecisionsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sharder_webhook_decisions_total",
		Help: "Answers of the label-protecting webhook by ring, decision (allowed, denied, fault) and reason.",
	}, []string{LabelRing, LabelDecision, LabelReason})

	// WebhookDecisionDuration is the time the handler takes to decide, from
	// a decoded request to its answer.
	WebhookDecisionDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "sharder_webhook_decision_duration_seconds",
		Help:    "Time the label-protecting webhook takes to decide a request, by ring.",
		Buckets: []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1},
	}, []string{LabelRing})
)

// Results of the assigning webhook (label "result").
const (
	// WebhookAssigned: the create was answered with the shard label.
	WebhookAssigned = "assigned"
	// WebhookSkipped: the create was let through without a label; the
	// sharder assigns the object from its watch.
	WebhookSkipped = "skipped"
)

var (
	// WebhookAssignmentsTotal counts the answers of the assigning
	// (mutating) webhook per ring, result (assigned, skipped) and reason.
	WebhookAssignmentsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sharder_webhook_assignments_total",
		Help: "Answers of the assigning webhook by ring, result (assigned, skipped) and reason.",
	}, []string{LabelRing, LabelAssignResult, LabelReason})

	// WebhookAssignmentDuration is the time the assigning handler takes to
	// answer, from a decoded request to its answer.
	WebhookAssignmentDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "sharder_webhook_assignment_duration_seconds",
		Help:    "Time the assigning webhook takes to answer a create, by ring.",
		Buckets: []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1},
	}, []string{LabelRing})
)

// ForgetWebhookRing deletes the webhook series of a deleted ring.
func ForgetWebhookRing(ring string) {
	match := prometheus.Labels{LabelRing: ring}
	WebhookDecisionsTotal.DeletePartialMatch(match)
	WebhookDecisionDuration.DeletePartialMatch(match)
	WebhookAssignmentsTotal.DeletePartialMatch(match)
	WebhookAssignmentDuration.DeletePartialMatch(match)
}
