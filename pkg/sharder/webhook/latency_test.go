package webhook_test

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/sharder/metrics"
	"github.com/sharder-dev/sharder/pkg/sharder/webhook"
)

// latencyRate and latencyRequests shape each run: a steady open-loop rate
// (requests start on schedule whatever the earlier ones take).
const (
	latencyRate     = 200 // requests per second
	latencyRequests = 2000
)

// BenchmarkWebhookLatency measures request latency through the API server
// at a steady 200 requests/s, for requests the webhook decides and for the
// same requests that do not reach it:
//
//   - update-denied: a dry-run update by a user changing the shard label
//     (sent to the webhook, denied) against update-baseline, a dry-run
//     update changing another label of the same object (not sent);
//   - create-allowed: an instance creating an object labelled with the
//     instance the sharder would choose (sent, allowed after the ring
//     lookup, stored) against create-baseline, the same creation without the
//     label (not sent).
//
// Run: go test ./pkg/sharder/webhook -run '^$' -bench WebhookLatency
func BenchmarkWebhookLatency(b *testing.B) {
	ctx := context.Background()
	ns := env().Namespace(b)
	r := createRing(b, ns)
	startSharder(b, webhook.Options{})
	probe := waitProtected(b, r.Name, ns)
	shard := v1alpha1.ShardLabel(r.Name)
	alice, inst := clientAs(b, userAlice), clientAs(b, instanceUser)
	createLease(b, clientAs(b, sharderUser), ns, r.Name, "inst-a", time.Now(), time.Hour)

	if err := alice.Get(ctx, client.ObjectKeyFromObject(probe), probe); err != nil {
		b.Fatal(err)
	}
	update := func(key, value string, wantDenied bool) func(int) error {
		return func(int) error {
			cm := probe.DeepCopy()
			cm.Labels = map[string]string{shard: probe.Labels[shard], key: value}
			err := alice.Update(ctx, cm, client.DryRunAll)
			if wantDenied {
				if apierrors.IsForbidden(err) {
					return nil
				}
				if err == nil {
					b.Error("label change allowed")
				}
			}
			return err
		}
	}
	create := func(prefix string, labels map[string]string) func(int) error {
		return func(i int) error {
			return inst.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
				Name: prefix + strconv.Itoa(i), Namespace: ns, Labels: labels}})
		}
	}

	for _, run := range []struct {
		name string
		do   func(i int) error
	}{
		{"update-baseline", update("team", "b", false)},
		{"update-denied", update(shard, "inst-b", true)},
		{"create-baseline", create("plain-", nil)},
		{"create-allowed", create("labelled-", map[string]string{shard: "inst-a"})},
	} {
		b.Run(run.name, func(b *testing.B) {
			before := webhookCalls(r.Name)
			sum, count := handlerTime(r.Name)
			for range b.N {
				p50, p99, errs := measure(run.do)
				b.ReportMetric(float64(p50.Microseconds())/1000, "p50-ms")
				b.ReportMetric(float64(p99.Microseconds())/1000, "p99-ms")
				b.ReportMetric(float64(errs), "errors")
			}
			b.ReportMetric(webhookCalls(r.Name)-before, "webhook-calls")
			if sum2, count2 := handlerTime(r.Name); count2 > count {
				b.ReportMetric((sum2-sum)/float64(count2-count)*1e6, "handler-mean-µs")
			}
			b.ReportMetric(0, "ns/op")
		})
	}
}

// handlerTime returns the total seconds the handler spent deciding
// requests of ring, and their number.
func handlerTime(ring string) (float64, uint64) {
	m := &dto.Metric{}
	if err := metrics.WebhookDecisionDuration.WithLabelValues(ring).(prometheus.Histogram).Write(m); err != nil {
		return 0, 0
	}
	return m.GetHistogram().GetSampleSum(), m.GetHistogram().GetSampleCount()
}

// measure runs latencyRequests calls of do at latencyRate and returns the
// latency quantiles and the number of failed calls.
func measure(do func(i int) error) (p50, p99 time.Duration, errs int) {
	return measureAt(latencyRate, latencyRequests, do)
}

// measureAt runs requests calls of do at rate per second.
func measureAt(rate, requests int, do func(i int) error) (p50, p99 time.Duration, errs int) {
	latencies := make([]time.Duration, requests)
	failed := make([]bool, requests)
	var wg sync.WaitGroup
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	// A fresh range of names per call, so creations never collide.
	base := int(time.Now().UnixNano() % 1e9)
	for i := range requests {
		<-tick.C
		wg.Go(func() {
			start := time.Now()
			err := do(base + i)
			latencies[i] = time.Since(start)
			failed[i] = err != nil
		})
	}
	wg.Wait()
	for _, f := range failed {
		if f {
			errs++
		}
	}
	slices.Sort(latencies)
	return latencies[len(latencies)/2], latencies[len(latencies)*99/100], errs
}
