package webhook_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/sharder-dev/sharder/internal/fixture"
	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/sharder/metrics"
	"github.com/sharder-dev/sharder/pkg/sharder/webhook"
)

// BenchmarkAdmissionAfterMembershipChange measures the creates of a ring in
// admission mode right after its membership changed: each round adds one
// ready instance to a ring of instances ready ones and, as soon as the
// Lease is written, sends 50 creates at 100/s. It reports their latency
// through the API server over all rounds (p50, p99, the slowest) and how
// many per round came back
// without the shard label (the webhook could not place them in time, or
// its call timed out), and the assigning handler's mean time per request.
//
// Run: go test ./pkg/sharder/webhook -run '^$' -bench AdmissionAfterMembershipChange -benchtime 3x
func BenchmarkAdmissionAfterMembershipChange(b *testing.B) {
	for _, instances := range []int{100, 1000} {
		b.Run(fmt.Sprintf("instances=%d", instances), func(b *testing.B) {
			ctx := context.Background()
			ns := env().Namespace(b)
			r := createRing(b, ns, admissionMode(ns))
			shard := v1alpha1.ShardLabel(r.Name)
			sharderClient := clientAs(b, sharderUser)
			createLeases(b, ns, r.Name, instances)
			startSharder(b, webhook.Options{})
			alice := clientAs(b, userAlice)
			waitAssigning(b, alice, r.Name, ns)

			const creates, rate = 50, 100
			var all []time.Duration
			unlabelled := 0
			handlerSum, handlerCount := histogramTime(metrics.WebhookAssignmentDuration, r.Name)
			b.ResetTimer()
			for round := range b.N {
				createLease(b, sharderClient, ns, r.Name, fmt.Sprintf("added-%d-%s", round, rand.String(4)), time.Now(), time.Hour)
				var mu sync.Mutex
				_, _, errs := measureAt(rate, creates, func(i int) error {
					cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "after-" + strconv.Itoa(i), Namespace: ns}}
					start := time.Now()
					err := alice.Create(ctx, cm)
					took := time.Since(start)
					mu.Lock()
					defer mu.Unlock()
					all = append(all, took)
					if err == nil && cm.Labels[shard] == "" {
						unlabelled++
					}
					return err
				})
				b.ReportMetric(float64(errs), "errors")
			}
			b.StopTimer()
			slices.Sort(all)
			b.ReportMetric(float64(all[len(all)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(all[len(all)*99/100].Microseconds())/1000, "p99-ms")
			b.ReportMetric(float64(all[len(all)-1].Microseconds())/1000, "max-ms")
			b.ReportMetric(float64(unlabelled)/float64(b.N), "unlabelled/round")
			if sum, count := histogramTime(metrics.WebhookAssignmentDuration, r.Name); count > handlerCount {
				b.ReportMetric((sum-handlerSum)/float64(count-handlerCount)*1e6, "assign-handler-mean-µs")
			}
			b.ReportMetric(0, "ns/op")
		})
	}
}

// createLeases creates n ready instance Leases of ring, 20 at a time.
func createLeases(b *testing.B, ns, ring string, n int) {
	b.Helper()
	c := clientAs(b, sharderUser)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 20)
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := c.Create(context.Background(), fixture.InstanceLease(ring, ns, fmt.Sprintf("inst-%04d", i), time.Now(), time.Hour)); err != nil {
				b.Errorf("creating Lease %d: %v", i, err)
			}
		})
	}
	wg.Wait()
}
