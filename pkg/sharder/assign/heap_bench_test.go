package assign_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/metadata"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/sharder/assign"
	"github.com/sharder-dev/sharder/pkg/sharder/leasecontroller"
)

// heapObjects is the number of objects BenchmarkHeapPerObject adds.
const heapObjects = 20000

// liveHeap returns the bytes of live heap after two collections.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// BenchmarkHeapPerObject starts the sharder on a ring with no objects,
// measures the live heap, then creates 20,000 ConfigMaps, waits until every
// one is assigned and measures again. It reports the live heap the sharder
// keeps per additional object at steady state (the benchmark's own clients
// hold no object between the two measurements).
func BenchmarkHeapPerObject(b *testing.B) {
	for range b.N {
		b.StopTimer()
		ns := env().Namespace(b)
		reg := leasecontroller.NewRegistry()
		reg.Set(ns, members(membership.StateReady, "a", "b", "c"))
		benchRing(b, ns)
		stop := startSharder(b, reg, assign.Options{Workers: benchWorkers()})
		time.Sleep(2 * time.Second) // caches synced, status written
		before := liveHeap()

		createMany(b, ns, "cm", heapObjects)
		mc, err := metadata.NewForConfig(fastConfig())
		if err != nil {
			b.Fatal(err)
		}
		shard := v1alpha1.ShardLabel(ns)
		deadline := time.Now().Add(3 * time.Minute)
		for {
			list, err := mc.Resource(configMaps).Namespace(ns).List(context.Background(), metav1.ListOptions{LabelSelector: shard})
			if err != nil {
				b.Fatal(err)
			}
			n := len(list.Items)
			list = nil
			if n == heapObjects {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("%d of %d objects assigned", n, heapObjects)
			}
			time.Sleep(500 * time.Millisecond)
		}
		time.Sleep(2 * time.Second) // status written, queues empty
		after := liveHeap()
		b.ReportMetric(float64(int64(after)-int64(before))/heapObjects, "heap-B/object")
		b.ReportMetric(float64(after)/(1<<20), "heap-MiB")
		stop()
	}
}
