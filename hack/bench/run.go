package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/internal/localrun"
	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// The ring, namespaces and identity of the run.
const (
	ringName        = "bench"
	objectNamespace = "bench"
	leaseNamespace  = "bench-instances"
	instanceAccount = "bench-instance"
	benchLabel      = "bench.sharder.dev/objects"
)

var (
	configMaps    = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	configMapKind = schema.GroupKind{Kind: "ConfigMap"}
)

type params struct {
	output, dir   string
	keep          bool
	objects       int
	largeObjects  int
	rate          int
	rateObjects   int
	workers       int
	leaseDuration time.Duration
	sharderArgs   []string
	sharderEnv    []string
	loadBefore    string
}

// row is one line of the results table.
type row struct {
	measure, value, target, verdict string
}

// bench is one run: the cluster, its instances and what was measured.
type bench struct {
	p         params
	cl        *localrun.Cluster
	c         client.Client
	self      string
	instUser  *localrun.User
	instances map[string]*localrun.Process
	tracker   *localrun.Tracker
	sharder   *localrun.Sharder
	rows      []row
}

func run(ctx context.Context, p params) (err error) {
	dir, err := localrun.TempDir(p.dir, "sharder-bench-")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil || p.keep {
			fmt.Fprintf(os.Stderr, "logs of the run are in %s\n", dir)
			return
		}
		_ = os.RemoveAll(dir)
	}()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	start := time.Now()
	p.loadBefore = loadAverage()
	fmt.Println("building the sharder and starting the local control plane ...")
	cl, err := localrun.NewCluster(localrun.ClusterOptions{Dir: dir, CRDs: []string{"config/crd/bases"}})
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			fmt.Fprintf(os.Stderr, "sharder log: %s\n", cl.LogDir)
		}
		_ = cl.Stop()
	}()
	b := &bench{p: p, cl: cl, c: cl.Client(), self: self, instances: map[string]*localrun.Process{}}
	if err := b.setUp(ctx); err != nil {
		return err
	}
	steps := []struct {
		name string
		fn   func(context.Context) error
	}{
		{"initial assignment", b.initialAssignment},
		{"assignment latency", b.latency},
		{"rebalance", b.rebalance},
		{"fail-over", b.failover},
		{"memory", b.memory},
	}
	for _, s := range steps {
		fmt.Printf("measuring %s ...\n", s.name)
		if err := s.fn(ctx); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
	}
	fmt.Printf("done in %s\n\n", time.Since(start).Round(time.Second))
	table := b.table()
	fmt.Print(table)
	if p.output != "" {
		if err := writeReport(p, table); err != nil {
			return err
		}
		fmt.Printf("\nwritten to %s\n", p.output)
	}
	return nil
}

func (b *bench) setUp(ctx context.Context) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: objectNamespace, Labels: map[string]string{benchLabel: "true"}}}
	if err := b.c.Create(ctx, ns); err != nil {
		return err
	}
	if err := localrun.EnsureNamespace(ctx, b.c, leaseNamespace); err != nil {
		return err
	}
	drainTimeout := metav1.Duration{Duration: 30 * time.Second}
	r := &sharderv1alpha1.ControllerRing{
		ObjectMeta: metav1.ObjectMeta{Name: ringName},
		Spec: sharderv1alpha1.ControllerRingSpec{
			LeaseNamespace:          leaseNamespace,
			Resources:               []sharderv1alpha1.RingResource{{Group: "", Resource: "configmaps"}},
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{benchLabel: "true"}},
			DrainTimeout:            &drainTimeout,
			InstanceServiceAccounts: []sharderv1alpha1.ServiceAccountReference{{Namespace: leaseNamespace, Name: instanceAccount}},
		},
	}
	if err := b.c.Create(ctx, r); err != nil {
		return fmt.Errorf("creating the ring: %w", err)
	}
	var err error
	b.instUser, err = b.cl.ControlPlane.AddServiceAccountUser("instance", leaseNamespace, instanceAccount)
	if err != nil {
		return err
	}
	b.tracker, err = localrun.NewTracker(b.cl.ControlPlane.Config, configMaps, objectNamespace, ringName)
	if err != nil {
		return err
	}
	return b.tracker.Start(ctx)
}

// startInstance starts a simulated instance process and waits until it
// holds its Lease.
func (b *bench) startInstance(ctx context.Context, id string) (*coordinationv1.Lease, error) {
	p, err := b.cl.Start(localrun.ProcessOptions{Name: id, Path: b.self, Args: []string{instanceCommand,
		"--kubeconfig", b.instUser.Kubeconfig, "--ring", ringName, "--lease-namespace", leaseNamespace,
		"--id", id, "--lease-duration", b.p.leaseDuration.String()}})
	if err != nil {
		return nil, err
	}
	b.instances[id] = p
	var lease coordinationv1.Lease
	err = localrun.Poll(ctx, time.Minute, 100*time.Millisecond, func() error {
		if p.Exited() {
			return fmt.Errorf("instance %s exited: %w\n%s", id, p.ExitError(), p.Logs())
		}
		if err := b.c.Get(ctx, client.ObjectKey{Namespace: leaseNamespace, Name: id}, &lease); err != nil {
			return err
		}
		if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != id {
			return errors.New("lease not held yet")
		}
		return nil
	})
	return &lease, err
}

func (b *bench) liveInstances() []string {
	var ids []string
	for id, p := range b.instances {
		if !p.Exited() {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids
}

func (b *bench) wait(ctx context.Context, timeout time.Duration, cond func([]localrun.Tracked) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return b.tracker.Wait(ctx, cond)
}

// initialAssignment: objects exist and instances hold their Leases before
// the sharder starts; measured from the sharder's start to the last object
// labelled.
func (b *bench) initialAssignment(ctx context.Context) error {
	start := time.Now()
	if err := createObjects(ctx, b.c, "pre", 0, b.p.objects, b.p.workers); err != nil {
		return err
	}
	fmt.Printf("  created %d ConfigMaps in %s\n", b.p.objects, time.Since(start).Round(time.Millisecond))
	for i := range 3 {
		if _, err := b.startInstance(ctx, instanceID(i)); err != nil {
			return err
		}
	}
	if err := b.wait(ctx, time.Minute, func(objs []localrun.Tracked) error {
		if len(objs) != b.p.objects {
			return fmt.Errorf("%d objects tracked", len(objs))
		}
		return nil
	}); err != nil {
		return err
	}
	t0 := time.Now()
	var err error
	b.sharder, err = b.cl.StartSharder(ctx, localrun.SharderOptions{Name: "sharder", Args: b.p.sharderArgs, Env: b.p.sharderEnv})
	if err != nil {
		return err
	}
	if err := b.wait(ctx, 5*time.Minute, localrun.SettledOn(configMapKind, b.p.objects, b.liveInstances()...)); err != nil {
		return err
	}
	last := lastChange(b.tracker.Snapshot())
	took := last.Sub(t0)
	b.add(fmt.Sprintf("assign %d pre-existing objects (from sharder start, 3 instances)", b.p.objects),
		seconds(took), "≤ 5 s", took <= 5*time.Second)
	return nil
}

// latency creates objects at a steady rate and measures, per object, the
// time from the create request to the shard label seen on a watch.
func (b *bench) latency(ctx context.Context) error {
	n, rate := b.p.rateObjects, b.p.rate
	starts := make([]time.Time, n)
	var wg sync.WaitGroup
	var failed atomic.Int64
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for i := range n {
		<-tick.C
		starts[i] = time.Now()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := createObject(ctx, b.c, objectName("rate", i)); err != nil {
				failed.Add(1)
			}
		}()
	}
	wg.Wait()
	if f := failed.Load(); f > 0 {
		return fmt.Errorf("%d creations failed", f)
	}
	total := b.p.objects + n
	if err := b.wait(ctx, time.Minute, localrun.AllAssigned(total)); err != nil {
		return err
	}
	lat := make([]time.Duration, n)
	for i := range n {
		o, ok := b.tracker.Get(objectNamespace + "/" + objectName("rate", i))
		if !ok {
			return fmt.Errorf("object %d not tracked", i)
		}
		lat[i] = max(o.FirstAssigned.Sub(starts[i]), 0)
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	p50, p99 := lat[n*50/100], lat[min(n*99/100, n-1)]
	b.add(fmt.Sprintf("assignment latency p50 (%d objects created at %d/s)", n, rate), millis(p50), "", true)
	b.add(fmt.Sprintf("assignment latency p99 (%d objects created at %d/s)", n, rate), millis(p99), "≤ 50 ms", p99 <= 50*time.Millisecond)
	b.add("assignment latency max", millis(lat[n-1]), "", true)
	if err := deleteObjects(ctx, b.c, "rate", 0, n, b.p.workers); err != nil {
		return err
	}
	return b.wait(ctx, time.Minute, localrun.AllAssigned(b.p.objects))
}

// rebalance adds a fourth instance and measures from its Lease's
// acquisition to the last object moved, and the fraction of objects moved.
func (b *bench) rebalance(ctx context.Context) error {
	before := b.tracker.Assignment()
	lease, err := b.startInstance(ctx, instanceID(3))
	if err != nil {
		return err
	}
	if err := b.wait(ctx, 5*time.Minute, localrun.SettledOn(configMapKind, b.p.objects, b.liveInstances()...)); err != nil {
		return err
	}
	after := b.tracker.Assignment()
	acquired := lease.Spec.AcquireTime.Time
	took := lastChange(b.tracker.Snapshot()).Sub(acquired)
	var first time.Time
	for _, o := range b.tracker.Snapshot() {
		if o.Instance == instanceID(3) && (first.IsZero() || o.Changed.Before(first)) {
			first = o.Changed
		}
	}
	moved := float64(localrun.Moved(before, after)) / float64(len(after))
	b.add(fmt.Sprintf("3 → 4 rebalance of %d objects (from the 4th Lease's acquisition)", b.p.objects),
		fmt.Sprintf("%s (first object arrived at %s)", seconds(took), seconds(first.Sub(acquired))), "≤ 4 s", took <= 4*time.Second)
	b.add("3 → 4 moved fraction (ideal 0.250)", fmt.Sprintf("%.3f (%.2f × ideal)", moved, moved/0.25), "≤ 1.10 × ideal", moved/0.25 <= 1.10)
	return nil
}

// failover kills an instance with SIGKILL and measures from its last Lease
// renewal to the last of its objects reassigned.
func (b *bench) failover(ctx context.Context) error {
	victim := instanceID(1)
	var mine []string
	for _, o := range b.tracker.Snapshot() {
		if o.Instance == victim {
			mine = append(mine, o.Key)
		}
	}
	if err := b.instances[victim].Kill(); err != nil {
		return err
	}
	var lease coordinationv1.Lease
	if err := b.c.Get(ctx, client.ObjectKey{Namespace: leaseNamespace, Name: victim}, &lease); err != nil {
		return err
	}
	lastRenewal := lease.Spec.RenewTime.Time
	if err := b.wait(ctx, 2*time.Minute, localrun.SettledOn(configMapKind, b.p.objects, b.liveInstances()...)); err != nil {
		return err
	}
	var first, last time.Time
	for _, k := range mine {
		o, _ := b.tracker.Get(k)
		if o.Changed.After(last) {
			last = o.Changed
		}
		if first.IsZero() || o.Changed.Before(first) {
			first = o.Changed
		}
	}
	took := last.Sub(lastRenewal)
	d := b.p.leaseDuration
	b.add(fmt.Sprintf("fail-over of %d objects after SIGKILL (lease %s; from the last renewal)", len(mine), d),
		fmt.Sprintf("%s (first object moved at %s)", seconds(took), seconds(first.Sub(lastRenewal))),
		fmt.Sprintf("≤ 2 × lease + 1 s = %s", seconds(2*d+time.Second)), took <= 2*d+time.Second)
	return nil
}

// memory reads the sharder's resident memory at steady state with the
// objects there are, then with largeObjects.
func (b *bench) memory(ctx context.Context) error {
	small, err := b.steadyMemory(ctx)
	if err != nil {
		return err
	}
	smallHeap, err := heapInUse(ctx, b.sharder.MetricsAddress)
	if err != nil {
		return err
	}
	cpu, err := b.idleCPU(ctx, 10*time.Second)
	if err != nil {
		return err
	}
	start := time.Now()
	extra := b.p.largeObjects - b.p.objects
	if err := createObjects(ctx, b.c, "large", 0, extra, b.p.workers); err != nil {
		return err
	}
	created := time.Since(start)
	if err := b.wait(ctx, 10*time.Minute, localrun.AllAssigned(b.p.largeObjects, b.liveInstances()...)); err != nil {
		return err
	}
	fmt.Printf("  created and assigned %d more objects in %s (creation alone %s)\n", extra, time.Since(start).Round(time.Millisecond), created.Round(time.Millisecond))
	large, err := b.steadyMemory(ctx)
	if err != nil {
		return err
	}
	largeHeap, err := heapInUse(ctx, b.sharder.MetricsAddress)
	if err != nil {
		return err
	}
	perObject := (float64(large.RSS) - float64(small.RSS)) / float64(extra)
	heapPerObject := (largeHeap - smallHeap) / float64(extra)
	b.add("sharder CPU while nothing changes (10 s)", fmt.Sprintf("%.1f %% of a core", cpu*100), "close to 0", cpu < 0.02)
	b.add(fmt.Sprintf("sharder RSS with %d objects", b.p.objects), mib(small.RSS), "", true)
	b.add(fmt.Sprintf("sharder RSS with %d objects", b.p.largeObjects), mib(large.RSS), "", true)
	b.add(fmt.Sprintf("sharder peak RSS (VmHWM) over the run, up to %d objects", b.p.largeObjects), mib(large.Peak), "< 120 MiB", large.Peak < 120<<20)
	b.add("sharder memory per additional object", fmt.Sprintf("%.0f B", perObject), "≤ 1 KiB", perObject <= 1024)
	b.add(fmt.Sprintf("sharder Go heap in use with %d / %d objects", b.p.objects, b.p.largeObjects),
		fmt.Sprintf("%s / %s (%.0f B per additional object)", mib(uint64(smallHeap)), mib(uint64(largeHeap)), heapPerObject), "", true)
	return nil
}

// heapInUse reads go_memstats_heap_inuse_bytes from the sharder's metrics
// endpoint (plain HTTP on loopback).
func heapInUse(ctx context.Context, addr string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("reading the sharder's metrics: %w", err)
	}
	defer resp.Body.Close()
	s := bufio.NewScanner(resp.Body)
	s.Buffer(make([]byte, 64*1024), 1024*1024)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "go_memstats_heap_inuse_bytes "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	if err := s.Err(); err != nil {
		return 0, err
	}
	return 0, errors.New("go_memstats_heap_inuse_bytes missing from the sharder's metrics")
}

// steadyMemory waits until the sharder's RSS stops growing and returns it.
func (b *bench) steadyMemory(ctx context.Context) (localrun.Memory, error) {
	var prev localrun.Memory
	for i := 0; ; i++ {
		m, err := b.sharder.Memory()
		if err != nil {
			return m, err
		}
		if i >= 3 && m.RSS <= prev.RSS+(1<<20) {
			return m, nil
		}
		prev = m
		select {
		case <-ctx.Done():
			return m, ctx.Err()
		case <-time.After(3 * time.Second):
		}
	}
}

// idleCPU returns the sharder's CPU use (cores) over d while nothing
// changes, from /proc/<pid>/stat.
func (b *bench) idleCPU(ctx context.Context, d time.Duration) (float64, error) {
	before, err := cpuTime(b.sharder.Pid())
	if err != nil {
		return 0, err
	}
	t0 := time.Now()
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(d):
	}
	after, err := cpuTime(b.sharder.Pid())
	if err != nil {
		return 0, err
	}
	return (after - before).Seconds() / time.Since(t0).Seconds(), nil
}

func (b *bench) add(measure, value, target string, ok bool) {
	verdict := "ok"
	if target == "" {
		verdict = ""
	} else if !ok {
		verdict = "missed"
	}
	b.rows = append(b.rows, row{measure, value, target, verdict})
	fmt.Printf("  %s: %s\n", measure, value)
}

func lastChange(objs []localrun.Tracked) time.Time {
	var last time.Time
	for _, o := range objs {
		if o.Changed.After(last) {
			last = o.Changed
		}
	}
	return last
}

func instanceID(i int) string { return "instance-" + strconv.Itoa(i) }

func objectName(prefix string, i int) string { return fmt.Sprintf("%s-%05d", prefix, i) }

func createObject(ctx context.Context, c client.Client, name string) error {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: objectNamespace, Name: name}, Data: map[string]string{"k": "v"}}
	if err := c.Create(ctx, cm); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}

// createObjects creates ConfigMaps prefix-<from..to) with parallel workers.
func createObjects(ctx context.Context, c client.Client, prefix string, from, to, workers int) error {
	return parallel(ctx, from, to, workers, func(i int) error { return createObject(ctx, c, objectName(prefix, i)) })
}

func deleteObjects(ctx context.Context, c client.Client, prefix string, from, to, workers int) error {
	return parallel(ctx, from, to, workers, func(i int) error {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: objectNamespace, Name: objectName(prefix, i)}}
		return client.IgnoreNotFound(c.Delete(ctx, cm))
	})
}

func parallel(ctx context.Context, from, to, workers int, fn func(int) error) error {
	next := make(chan int)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := fn(i); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		}()
	}
	func() {
		defer close(next)
		for i := from; i < to; i++ {
			select {
			case next <- i:
			case <-ctx.Done():
				return
			}
		}
	}()
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return ctx.Err()
	}
}

func seconds(d time.Duration) string { return fmt.Sprintf("%.2f s", d.Seconds()) }
func millis(d time.Duration) string  { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }
func mib(b uint64) string            { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
