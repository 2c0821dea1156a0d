package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync"
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
	// unrelatedNamespace is outside the ring while the sharder process
	// runs: the floor is measured on its objects. The in-process variant
	// then adds it to the ring and assigns its objects.
	unrelatedNamespace = "bench-unrelated"
	leaseNamespace     = "bench-instances"
	instanceAccount    = "bench-instance"
	benchLabel         = "bench.sharder.dev/objects"
)

var (
	configMaps    = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	configMapKind = schema.GroupKind{Kind: "ConfigMap"}
)

type params struct {
	output, dir     string
	keep            bool
	objects         int
	largeObjects    int
	rate            int
	rateObjects     int
	workers         int
	floorPatches    int
	floorWorkers    int
	profileDuration time.Duration
	leaseDuration   time.Duration
	sharderArgs     []string
	sharderEnv      []string
	steps           []string
	loadBefore      string
	loadAfter       string
	// The scale mode (scale.go).
	scale     bool
	instances int
	steady    time.Duration
	// algorithm is the ring's spec.algorithm; empty for the default.
	algorithm string
	// leaderLease is the sharder's leader election lease duration; zero
	// for localrun's short default.
	leaderLease time.Duration
	// revision is the commit the sharder is built from (scale mode).
	revision string
	// The objects mode (objects.go).
	manyObjects     bool
	watchedObjects  int
	admittedObjects int
	// The slots mode (slots.go).
	slots     bool
	slotCount int
	// existingObjects (--slots) are created with their slot label before
	// the sharder and the instances start.
	existingObjects int
	// apiServerFlags and etcdFlags are added to the control plane's
	// command lines.
	apiServerFlags, etcdFlags map[string]string
}

// row is one line of the results table.
type row struct {
	measure, value, floor, target, verdict string
}

// bench is one run: the cluster, its instances and what was measured.
type bench struct {
	p         params
	cl        *localrun.Cluster
	c         client.Client
	self      string
	instUser  *localrun.User
	instances map[string]*localrun.Process
	// killed holds the instances the bench killed on purpose.
	killed  map[string]bool
	tracker *localrun.LabelWatch
	// unrelated tracks the objects of unrelatedNamespace.
	unrelated *localrun.LabelWatch
	sharder   *localrun.Sharder
	// pprofAddress serves the sharder process's /debug/pprof/.
	pprofAddress string
	patcher      *floorPatcher
	// stopped is the floor with no sharder running, idle with the sharder
	// process running idle.
	stopped, idle floor
	// ringFloor is the floor of the sharder's own writes: the shard label
	// written on the ring's objects with no sharder running. The ratios of
	// the sharder's steps are to it.
	ringFloor floor
	// stepFloor, when measured, is the floor of the step that runs: the
	// ring's shard label written outside the ring just before it.
	stepFloor floor
	floors    []floor
	// heapSmall is the sharder's live heap with the objects of the first
	// steps cached.
	heapSmall float64
	rows      []row
	// profiles are the `go tool pprof -top` lines of the sharder per step
	// whose target was missed.
	profiles []profile
}

// onCluster starts a local control plane in a new folder (p.dir, or a
// temporary one named after pattern), builds the sharder, and runs fn on
// it. It stops the control plane afterwards and removes the folder, unless
// fn failed or p.keep asks to keep it.
func onCluster(p params, pattern string, fn func(*bench) error) (err error) {
	dir, err := localrun.TempDir(p.dir, pattern)
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
	p.loadBefore = loadAverage()
	fmt.Println("building the sharder and starting the local control plane ...")
	cl, err := localrun.NewCluster(localrun.ClusterOptions{Dir: dir, CRDs: []string{"config/crd/bases"},
		APIServerFlags: p.apiServerFlags, EtcdFlags: p.etcdFlags})
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			fmt.Fprintf(os.Stderr, "sharder log: %s\n", cl.LogDir)
		}
		_ = cl.Stop()
	}()
	return fn(&bench{p: p, cl: cl, c: cl.Client(), self: self, instances: map[string]*localrun.Process{}, killed: map[string]bool{}})
}

func (b *bench) setUp(ctx context.Context) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: objectNamespace, Labels: map[string]string{benchLabel: "true"}}}
	if err := b.c.Create(ctx, ns); err != nil {
		return err
	}
	for _, name := range []string{leaseNamespace, unrelatedNamespace} {
		if err := localrun.EnsureNamespace(ctx, b.c, name); err != nil {
			return err
		}
	}
	if err := b.createRing(ctx); err != nil {
		return err
	}
	var err error
	b.instUser, err = b.cl.ControlPlane.AddServiceAccountUser("instance", leaseNamespace, instanceAccount)
	if err != nil {
		return err
	}
	b.patcher, err = newFloorPatcher(b.cl.ControlPlane.Config, unrelatedNamespace, b.p.floorWorkers, b.p.objects)
	if err != nil {
		return err
	}
	b.tracker, err = localrun.NewLabelWatch(b.cl.ControlPlane.Config, configMaps, objectNamespace, ringName)
	if err != nil {
		return err
	}
	if err := b.tracker.Start(ctx); err != nil {
		return err
	}
	b.unrelated, err = localrun.NewLabelWatch(b.cl.ControlPlane.Config, configMaps, unrelatedNamespace, ringName)
	if err != nil {
		return err
	}
	return b.unrelated.Start(ctx)
}

// createRing creates the ring over the ConfigMaps of the namespaces
// labelled benchLabel, its instances' Leases in leaseNamespace.
func (b *bench) createRing(ctx context.Context) error {
	drainTimeout := metav1.Duration{Duration: 30 * time.Second}
	r := &sharderv1alpha1.ControllerRing{
		ObjectMeta: metav1.ObjectMeta{Name: ringName},
		Spec: sharderv1alpha1.ControllerRingSpec{
			LeaseNamespace:          leaseNamespace,
			Algorithm:               b.p.algorithm,
			Resources:               []sharderv1alpha1.RingResource{{Group: "", Resource: "configmaps"}},
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{benchLabel: "true"}},
			DrainTimeout:            &drainTimeout,
			InstanceServiceAccounts: []sharderv1alpha1.ServiceAccountReference{{Namespace: leaseNamespace, Name: instanceAccount}},
		},
	}
	if err := b.c.Create(ctx, r); err != nil {
		return fmt.Errorf("creating the ring: %w", err)
	}
	return nil
}

// startSharder starts the sharder process with its profiling endpoint on.
func (b *bench) startSharder(ctx context.Context, name string) error {
	var err error
	if b.pprofAddress, err = localrun.FreeAddress(); err != nil {
		return err
	}
	args := append([]string{"--pprof-bind-address", b.pprofAddress}, b.p.sharderArgs...)
	b.sharder, err = b.cl.StartSharder(ctx, localrun.SharderOptions{Name: name, Args: args, Env: b.p.sharderEnv, LeaderLeaseDuration: b.p.leaderLease})
	return err
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

// wait waits until cond holds for the objects of the ring's namespace. It
// fails at once when a simulated instance exits that the bench did not
// kill: the figure would not be the one measured.
func (b *bench) wait(ctx context.Context, timeout time.Duration, cond func([]localrun.Watched) error) error {
	return b.waitOn(ctx, b.tracker, timeout, cond)
}

func (b *bench) waitOn(ctx context.Context, t *localrun.LabelWatch, timeout time.Duration, cond func([]localrun.Watched) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	ctx, stop := context.WithTimeout(ctx, timeout)
	defer stop()
	go func() {
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			for id, p := range b.instances {
				if p.Exited() && !b.killed[id] {
					cancel(fmt.Errorf("instance %s exited during the step (%w); on an overloaded machine an instance can miss its Lease's renew deadline and stop: run again", id, p.ExitError()))
					return
				}
			}
		}
	}()
	err := t.Wait(ctx, cond)
	if cause := context.Cause(ctx); err != nil && cause != nil && !errors.Is(cause, context.DeadlineExceeded) && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return err
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

func lastChange(objs []localrun.Watched) time.Time {
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

// createObject creates ConfigMap namespace/name and returns it as the API
// server answered.
func createObject(ctx context.Context, c client.Client, namespace, name string) (*corev1.ConfigMap, error) {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}, Data: map[string]string{"k": "v"}}
	if err := c.Create(ctx, cm); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	return cm, nil
}

// createObjects creates ConfigMaps prefix-<0..n) in namespace with
// parallel workers.
func createObjects(ctx context.Context, c client.Client, namespace, prefix string, n, workers int) error {
	return parallel(ctx, 0, n, workers, func(i int) error {
		_, err := createObject(ctx, c, namespace, objectName(prefix, i))
		return err
	})
}

func deleteObjects(ctx context.Context, c client.Client, namespace, prefix string, from, to, workers int) error {
	return parallel(ctx, from, to, workers, func(i int) error {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: objectName(prefix, i)}}
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
