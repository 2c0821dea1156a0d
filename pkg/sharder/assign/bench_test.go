package assign_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/drain"
	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/sharder/assign"
	"github.com/sharder-dev/sharder/pkg/sharder/leasecontroller"
)

// The benchmarks measure the targets of the assignment controller against
// the local control plane. Run them one at a time with -benchtime=1x, e.g.
//
//	go test -run '^$' -bench BenchmarkAssignExisting10k -benchtime=1x ./pkg/sharder/assign/
//
// Figures: seconds until every object is where the ring wants it (as a
// separate watch sees it), assignment latency percentiles, the moved
// fraction, and the sharder's CPU time while idle.

const benchObjects = 10000

// fastConfig is an admin config without client-side rate limiting, for the
// test code creating objects and playing instances.
func fastConfig() *rest.Config {
	cfg := rest.CopyConfig(env().Config)
	cfg.QPS, cfg.Burst = -1, 0
	return cfg
}

// createMany creates n ConfigMaps named <prefix>-<i> in ns with 32 writers.
func createMany(b *testing.B, ns, prefix string, n int) []string {
	b.Helper()
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	work := make(chan string)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for name := range work {
				cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
				if err := env().Client.Create(context.Background(), cm); err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
				}
			}
		}()
	}
	for _, name := range names {
		work <- name
	}
	close(work)
	wg.Wait()
	if firstErr != nil {
		b.Fatalf("creating ConfigMaps: %v", firstErr)
	}
	return names
}

// placement follows the ring labels of a namespace's ConfigMaps through a
// watch and reports when every wanted object has its wanted instance and no
// drain label.
type placement struct {
	mu      sync.Mutex
	ring    string
	want    map[string]string // name -> instance; "" means any instance
	ok      map[string]bool
	first   map[string]time.Time // first time at its wanted instance
	shards  map[string]map[string]bool
	last    map[string]*metav1.PartialObjectMetadata
	done    chan struct{}
	closed  bool
	created map[string]time.Time
}

func newPlacement(ring string) *placement {
	return &placement{ring: ring, want: map[string]string{}, ok: map[string]bool{}, first: map[string]time.Time{},
		shards: map[string]map[string]bool{}, last: map[string]*metav1.PartialObjectMetadata{}, created: map[string]time.Time{}, done: make(chan struct{})}
}

// expect sets the wanted placement and re-arms done.
func (p *placement) expect(want map[string]string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.want = want
	p.done = make(chan struct{})
	p.closed = false
	p.ok = map[string]bool{}
	p.first = map[string]time.Time{}
	for _, m := range p.last {
		p.judgeLocked(m, time.Now())
	}
	p.checkLocked()
}

func (p *placement) observe(obj any) {
	m, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return
	}
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.last[m.Name] = m
	if shard := m.Labels[v1alpha1.ShardLabel(p.ring)]; shard != "" {
		if p.shards[m.Name] == nil {
			p.shards[m.Name] = map[string]bool{}
		}
		p.shards[m.Name][shard] = true
	}
	p.judgeLocked(m, now)
	p.checkLocked()
}

// judgeLocked records whether m is where it is wanted.
func (p *placement) judgeLocked(m *metav1.PartialObjectMetadata, now time.Time) {
	want, wanted := p.want[m.Name]
	if !wanted {
		return
	}
	shard := m.Labels[v1alpha1.ShardLabel(p.ring)]
	good := shard != "" && (want == "" || shard == want) && !drain.Requested(m, p.ring)
	if good && p.first[m.Name].IsZero() {
		p.first[m.Name] = now
	}
	if good {
		p.ok[m.Name] = true
	} else {
		delete(p.ok, m.Name)
	}
}

func (p *placement) checkLocked() {
	if !p.closed && len(p.ok) == len(p.want) && len(p.want) > 0 {
		p.closed = true
		close(p.done)
	}
}

func (p *placement) wait(b *testing.B, timeout time.Duration) {
	b.Helper()
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	select {
	case <-done:
	case <-time.After(timeout):
		p.mu.Lock()
		defer p.mu.Unlock()
		b.Fatalf("only %d of %d objects placed after %v", len(p.ok), len(p.want), timeout)
	}
}

// firstArrival returns the earliest time an object reached the wanted
// instance, among the objects wanted at instance.
func (p *placement) firstArrival(instance string) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	var first time.Time
	for name, want := range p.want {
		if t := p.first[name]; want == instance && !t.IsZero() && (first.IsZero() || t.Before(first)) {
			first = t
		}
	}
	return first
}

// movedFraction is the share of names that carried more than one instance.
func (p *placement) movedFraction(names []string) float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	moved := 0
	for _, n := range names {
		if len(p.shards[n]) > 1 {
			moved++
		}
	}
	return float64(moved) / float64(len(names))
}

func watchPlacement(b *testing.B, ns string, p *placement) {
	b.Helper()
	mc, err := metadata.NewForConfig(fastConfig())
	if err != nil {
		b.Fatal(err)
	}
	inf := metadatainformer.NewFilteredMetadataInformer(mc, configMaps, ns, 0, nil, nil).Informer()
	_, _ = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    p.observe,
		UpdateFunc: func(_, o any) { p.observe(o) },
	})
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	go inf.RunWithContext(ctx)
	if !toolscache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		b.Fatal("placement watch did not sync")
	}
}

// fastAcknowledger plays every instance of a ring: it acknowledges each drain
// at once, with 32 concurrent writers.
func fastAcknowledger(b *testing.B, ns, ring string) {
	b.Helper()
	mc, err := metadata.NewForConfig(fastConfig())
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	work := make(chan *metav1.PartialObjectMetadata, 1024)
	for range 32 {
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case m := <-work:
					patch, err := drain.AcknowledgePatch(m, ring)
					if err != nil {
						continue
					}
					_, _ = mc.Resource(configMaps).Namespace(ns).Patch(ctx, m.Name, types.MergePatchType, patch, metav1.PatchOptions{})
				}
			}
		}()
	}
	inf := metadatainformer.NewFilteredMetadataInformer(mc, configMaps, ns, 0, nil, func(o *metav1.ListOptions) {
		o.LabelSelector = v1alpha1.DrainLabel(ring)
	}).Informer()
	handle := func(obj any) {
		if m, ok := obj.(*metav1.PartialObjectMetadata); ok {
			select {
			case work <- m:
			case <-ctx.Done():
			}
		}
	}
	_, _ = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: handle, UpdateFunc: func(_, o any) { handle(o) }})
	go inf.RunWithContext(ctx)
	if !toolscache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		b.Fatal("acknowledger watch did not sync")
	}
}

func benchRing(b *testing.B, ns string) {
	b.Helper()
	newRing(b, ns, func(s *v1alpha1.ControllerRingSpec) { s.DrainTimeout = &metav1.Duration{Duration: time.Minute} })
}

func wantAll(names []string, instance func(string) string) map[string]string {
	want := make(map[string]string, len(names))
	for _, n := range names {
		want[n] = instance(n)
	}
	return want
}

// BenchmarkAssignExisting10k: 10,000 unassigned ConfigMaps exist; the
// sharder starts. Reports the seconds from start until all are labelled.
func BenchmarkAssignExisting10k(b *testing.B) {
	for range b.N {
		b.StopTimer()
		ns := env().Namespace(b)
		names := createMany(b, ns, "cm", benchObjects)
		reg := leasecontroller.NewRegistry()
		ready := []string{"a", "b", "c"}
		reg.Set(ns, members(membership.StateReady, ready...))
		benchRing(b, ns)
		p := newPlacement(ns)
		watchPlacement(b, ns, p)
		p.expect(wantAll(names, func(n string) string { return expected(b, ready, ns, n) }))
		b.StartTimer()

		start := time.Now()
		stop := startSharder(b, reg, assign.Options{Workers: benchWorkers()})
		p.wait(b, 2*time.Minute)
		elapsed := time.Since(start)
		b.ReportMetric(elapsed.Seconds(), "s/10k-assigned")
		b.ReportMetric(float64(benchObjects)/elapsed.Seconds(), "objects/s")
		b.StopTimer()
		stop()
	}
}

// BenchmarkAssignmentLatency creates ConfigMaps at 100/s for 10 s with the
// sharder running and reports latency percentiles from the create call to
// the shard label seen through a watch.
func BenchmarkAssignmentLatency(b *testing.B) {
	const rate, duration = 100, 10 * time.Second
	for range b.N {
		b.StopTimer()
		ns := env().Namespace(b)
		reg := leasecontroller.NewRegistry()
		reg.Set(ns, members(membership.StateReady, "a", "b", "c"))
		benchRing(b, ns)
		startSharder(b, reg, assign.Options{Workers: benchWorkers()})
		p := newPlacement(ns)
		watchPlacement(b, ns, p)
		// Measure a running sharder: wait until it assigned a first object.
		p.expect(map[string]string{createMany(b, ns, "warm-up", 1)[0]: ""})
		p.wait(b, time.Minute)
		n := int(rate * duration / time.Second)
		names := make([]string, n)
		for i := range names {
			names[i] = fmt.Sprintf("lat-%d", i)
		}
		p.expect(wantAll(names, func(string) string { return "" }))
		b.StartTimer()

		created := make([]time.Time, n)
		tick := time.NewTicker(time.Second / rate)
		var wg sync.WaitGroup
		for i, name := range names {
			<-tick.C
			created[i] = time.Now()
			wg.Add(1)
			go func() {
				defer wg.Done()
				cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
				if err := env().Client.Create(context.Background(), cm); err != nil {
					b.Errorf("creating: %v", err)
				}
			}()
		}
		tick.Stop()
		wg.Wait()
		p.wait(b, time.Minute)
		b.StopTimer()

		p.mu.Lock()
		lat := make([]time.Duration, 0, n)
		for i, name := range names {
			lat = append(lat, p.first[name].Sub(created[i]))
		}
		p.mu.Unlock()
		slices.Sort(lat)
		pct := func(q float64) float64 { return float64(lat[int(q*float64(len(lat)-1))].Microseconds()) / 1000 }
		b.ReportMetric(pct(0.50), "p50-ms")
		b.ReportMetric(pct(0.99), "p99-ms")
		b.ReportMetric(pct(1), "max-ms")
	}
}

// BenchmarkRebalance3To4 assigns 10,000 ConfigMaps to 3 instances, adds a
// fourth and, with every drain acknowledged at once, reports the seconds
// until every object is on its new instance and the fraction that moved.
func BenchmarkRebalance3To4(b *testing.B) {
	for range b.N {
		b.StopTimer()
		ns := env().Namespace(b)
		names := createMany(b, ns, "cm", benchObjects)
		reg := leasecontroller.NewRegistry()
		three, four := []string{"a", "b", "c"}, []string{"a", "b", "c", "d"}
		reg.Set(ns, members(membership.StateReady, three...))
		benchRing(b, ns)
		p := newPlacement(ns)
		watchPlacement(b, ns, p)
		p.expect(wantAll(names, func(n string) string { return expected(b, three, ns, n) }))
		startSharder(b, reg, assign.Options{Workers: benchWorkers()})
		p.wait(b, 2*time.Minute)
		fastAcknowledger(b, ns, ns)
		p.expect(wantAll(names, func(n string) string { return expected(b, four, ns, n) }))
		b.StartTimer()

		start := time.Now()
		reg.Set(ns, members(membership.StateReady, four...))
		p.wait(b, 2*time.Minute)
		elapsed := time.Since(start)
		b.StopTimer()
		b.ReportMetric(elapsed.Seconds(), "s/rebalance")
		b.ReportMetric(p.firstArrival("d").Sub(start).Seconds(), "s/first-arrival")
		b.ReportMetric(p.movedFraction(names), "moved-fraction")
		b.ReportMetric(p.movedFraction(names)/0.25, "moved/ideal")
	}
}

// BenchmarkIdleCPU runs the sharder on 10,000 assigned ConfigMaps and
// reports the CPU time this process (sharder plus one idle watch) uses per
// second of wall time while nothing changes.
func BenchmarkIdleCPU(b *testing.B) {
	const window = 10 * time.Second
	for range b.N {
		b.StopTimer()
		ns := env().Namespace(b)
		names := createMany(b, ns, "cm", benchObjects)
		reg := leasecontroller.NewRegistry()
		reg.Set(ns, members(membership.StateReady, "a", "b", "c"))
		benchRing(b, ns)
		p := newPlacement(ns)
		watchPlacement(b, ns, p)
		p.expect(wantAll(names, func(string) string { return "" }))
		startSharder(b, reg, assign.Options{})
		p.wait(b, 2*time.Minute)
		time.Sleep(2 * time.Second) // let the last status write and events settle
		b.StartTimer()

		before := cpuTime(b)
		time.Sleep(window)
		used := cpuTime(b) - before
		b.StopTimer()
		b.ReportMetric(float64(used.Milliseconds())/window.Seconds(), "cpu-ms/s")
	}
}

func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchWorkers is Options.Workers for the benchmarks: SHARDER_BENCH_WORKERS,
// else the default.
func benchWorkers() int {
	n, _ := strconv.Atoi(os.Getenv("SHARDER_BENCH_WORKERS"))
	return n
}

// BenchmarkPatchBaseline10k is the yardstick for the figures above: 10,000
// label merge patches sent straight to the API server by 16 writers, with no
// sharder involved. It reports patches per second the control plane takes on
// this machine.
func BenchmarkPatchBaseline10k(b *testing.B) {
	for range b.N {
		b.StopTimer()
		ns := env().Namespace(b)
		names := createMany(b, ns, "cm", benchObjects)
		mc, err := metadata.NewForConfig(fastConfig())
		if err != nil {
			b.Fatal(err)
		}
		work := make(chan string)
		var wg sync.WaitGroup
		b.StartTimer()
		start := time.Now()
		for range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for name := range work {
					patch := []byte(`{"metadata":{"labels":{"` + v1alpha1.ShardLabel(ns) + `":"a"}}}`)
					if _, err := mc.Resource(configMaps).Namespace(ns).Patch(context.Background(), name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
						b.Errorf("patching: %v", err)
					}
				}
			}()
		}
		for _, n := range names {
			work <- n
		}
		close(work)
		wg.Wait()
		elapsed := time.Since(start)
		b.StopTimer()
		b.ReportMetric(float64(len(names))/elapsed.Seconds(), "patches/s")
	}
}
