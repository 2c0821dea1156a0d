package webhook_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/sharder/metrics"
	"github.com/sharder-dev/sharder/pkg/sharder/webhook"
)

// admissionRate and admissionRequests shape each run of
// BenchmarkAdmissionLatency: creations at a steady 100/s.
const (
	admissionRate     = 100
	admissionRequests = 2000
)

// BenchmarkAdmissionLatency measures what assignment at admission adds to a
// create: the same ConfigMap creation, by a user, at a steady 100/s,
//
//   - create-outside: in a namespace outside the ring (no webhook is
//     called);
//   - create-admission: in a namespace of a ring in admission mode with two
//     ready instances. The assigning webhook adds the shard label, then the
//     validating webhook checks it; every create response must carry it
//     (a response without it counts as an error).
//
// Run: go test ./pkg/sharder/webhook -run '^$' -bench AdmissionLatency
func BenchmarkAdmissionLatency(b *testing.B) {
	ctx := context.Background()
	ns, outside := env().Namespace(b), env().Namespace(b)
	r := createRing(b, ns, admissionMode(ns))
	shard := v1alpha1.ShardLabel(r.Name)
	for _, id := range []string{"inst-a", "inst-b"} {
		createLease(b, clientAs(b, sharderUser), ns, r.Name, id, time.Now(), time.Hour)
	}
	startSharder(b, webhook.Options{})
	alice := clientAs(b, userAlice)
	waitAssigning(b, alice, r.Name, ns)

	create := func(namespace, prefix string, wantLabel bool) func(int) error {
		return func(i int) error {
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: prefix + strconv.Itoa(i), Namespace: namespace,
				Labels: map[string]string{"app": "bench"}}, Data: map[string]string{"k": "v"}}
			if err := alice.Create(ctx, cm); err != nil {
				return err
			}
			if _, ok := cm.Labels[shard]; ok != wantLabel {
				return errors.New("shard label in the create response: " + strconv.FormatBool(ok))
			}
			return nil
		}
	}
	for _, run := range []struct {
		name string
		do   func(i int) error
	}{
		{"create-outside", create(outside, "outside-", false)},
		{"create-admission", create(ns, "admitted-", true)},
	} {
		b.Run(run.name, func(b *testing.B) {
			assignBefore, validateBefore := assignCalls(r.Name), webhookCalls(r.Name)
			assignSum, assignCount := histogramTime(metrics.WebhookAssignmentDuration, r.Name)
			validateSum, validateCount := histogramTime(metrics.WebhookDecisionDuration, r.Name)
			for range b.N {
				p50, p99, errs := measureAt(admissionRate, admissionRequests, run.do)
				b.ReportMetric(float64(p50.Microseconds())/1000, "p50-ms")
				b.ReportMetric(float64(p99.Microseconds())/1000, "p99-ms")
				b.ReportMetric(float64(errs), "errors")
			}
			b.ReportMetric(assignCalls(r.Name)-assignBefore, "assign-calls")
			b.ReportMetric(webhookCalls(r.Name)-validateBefore, "validate-calls")
			if sum, count := histogramTime(metrics.WebhookAssignmentDuration, r.Name); count > assignCount {
				b.ReportMetric((sum-assignSum)/float64(count-assignCount)*1e6, "assign-handler-mean-µs")
			}
			if sum, count := histogramTime(metrics.WebhookDecisionDuration, r.Name); count > validateCount {
				b.ReportMetric((sum-validateSum)/float64(count-validateCount)*1e6, "validate-handler-mean-µs")
			}
			b.ReportMetric(0, "ns/op")
		})
	}
}

// histogramTime returns the total seconds and the number of observations of
// ring's series of h.
func histogramTime(h *prometheus.HistogramVec, ring string) (float64, uint64) {
	m := &dto.Metric{}
	if err := h.WithLabelValues(ring).(prometheus.Histogram).Write(m); err != nil {
		return 0, 0
	}
	return m.GetHistogram().GetSampleSum(), m.GetHistogram().GetSampleCount()
}
