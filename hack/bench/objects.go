package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/sharder-dev/sharder/internal/localrun"
	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/ring"
)

// The objects mode (--many-objects) measures one ring of many objects: a
// few instances, their Leases held by this process (fleet) and their drains
// acknowledged by it (acknowledger), as in the scale mode. Before the
// sharder first starts, the objects exist: most of them already labelled,
// as the assigning webhook labels objects created in admission mode, and
// some without a label, which the sharder assigns from its watch. Then a
// few objects are created through the webhook, the sharder is restarted,
// the API server's own figures are read, and one instance is added.

// Targets of the objects mode.
const (
	targetHeapPerObject = 400 // bytes of live heap per cached object
	targetPeakToSteady  = 1.2
	targetStartUp       = 60 * time.Second
	targetScaleOutCPU   = 2 * time.Second
)

const (
	// objectsPrefix names the ring's objects.
	objectsPrefix = "obj"
	// unassignedAtRestart objects lose their shard label while no sharder
	// runs, so that the restarted sharder's first decision shows on the
	// watch.
	unassignedAtRestart = 1000
	// decisionFocus selects the samples of the pass that decides, from the
	// caches, which objects a membership change moves.
	decisionFocus = `ringAssigner\).rebuild$`
	// syncedMessage is what the sharder logs once a ring's caches synced.
	syncedMessage = "Caches synced"
	// steadyAfter is how long after the objects are assigned the steady
	// RSS is read.
	steadyAfter = time.Minute
	// moveLimit bounds the wait for the scale-out's whole move.
	moveLimit = 10 * time.Minute
)

// objectsRun is one run of the objects mode.
type objectsRun struct {
	*bench
	fleet *fleet
	acks  *acknowledger
	// creator creates the objects over protobuf as the admin, asSharder as
	// the sharder.
	creator, asSharder kubernetes.Interface
	// total is the number of objects of the ring created so far; created
	// counts them as they are created.
	total   int
	created atomic.Int64
	// unassigned holds the keys of the objects without a label when the
	// sharder starts.
	unassigned map[string]bool
	// steadyRSS and heap are the restarted sharder's figures (apiServer
	// shows them beside the control plane's).
	steadyRSS, peakRSS uint64
	heap               float64
	heapTop            string
	// api are the control plane's figures.
	api []row
}

// controlPlaneFlags raise the limits of the run's control plane for a
// million objects: etcd's database quota (2 GiB by default) and the API
// server's requests in flight.
var (
	objectsAPIServerFlags = map[string]string{
		"max-requests-inflight":          "1000",
		"max-mutating-requests-inflight": "500",
	}
	objectsEtcdFlags = map[string]string{
		"quota-backend-bytes": fmt.Sprint(8 << 30),
	}
)

func runObjects(ctx context.Context, p params) error {
	ctrl.SetLogger(logr.Discard())
	p.leaderLease = 15 * time.Second // client-go's defaults: the machine is busy
	p.revision = sourceRevision()
	p.apiServerFlags, p.etcdFlags = objectsAPIServerFlags, objectsEtcdFlags
	return onCluster(p, "sharder-bench-objects-", func(b *bench) error {
		start := time.Now()
		o := &objectsRun{bench: b, unassigned: map[string]bool{}}
		defer func() {
			if o.fleet != nil {
				o.fleet.killAll()
			}
		}()
		steps := []struct {
			name string
			fn   func(context.Context) error
		}{
			{"set-up", o.setUp},
			{"first start", o.firstStart},
			{"creation in admission mode", o.admissionCreation},
			{"restart", o.restart},
			{"API server", o.apiServer},
			{"scale-out", o.scaleOut},
		}
		for _, st := range steps {
			fmt.Printf("%s ... (%s)\n", st.name, time.Since(start).Round(time.Second))
			if err := st.fn(ctx); err != nil {
				return fmt.Errorf("%s: %w", st.name, err)
			}
			// A report after every step: a long run stopped early keeps
			// the figures it has.
			if p.output != "" {
				o.p.loadAfter = loadAverage()
				if err := writeObjectsReport(o.p, o.report()); err != nil {
					return err
				}
			}
		}
		o.p.loadAfter = loadAverage()
		fmt.Printf("done in %s\n\n", time.Since(start).Round(time.Second))
		report := o.report()
		fmt.Print(report)
		if p.output != "" {
			if err := writeObjectsReport(o.p, report); err != nil {
				return err
			}
			fmt.Printf("\nwritten to %s\n", p.output)
		}
		return nil
	})
}

// setUp creates the ring (assigning from the watch), starts the fleet's
// holders and creates the objects the sharder will assign from its watch.
func (o *objectsRun) setUp(ctx context.Context) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: objectNamespace, Labels: map[string]string{benchLabel: "true"}}}
	if err := o.c.Create(ctx, ns); err != nil {
		return err
	}
	if err := localrun.EnsureNamespace(ctx, o.c, leaseNamespace); err != nil {
		return err
	}
	if err := o.createRing(ctx); err != nil {
		return err
	}
	var err error
	if o.instUser, err = o.cl.ControlPlane.AddServiceAccountUser("instance", leaseNamespace, instanceAccount); err != nil {
		return err
	}
	log, err := newFleetLog(filepath.Join(o.cl.LogDir, "fleet.log"))
	if err != nil {
		return err
	}
	go log.summarize(ctx, time.Second)
	if o.fleet, err = newFleet(o.instUser.Config, ringName, leaseNamespace, o.p.leaseDuration, log); err != nil {
		return err
	}
	if o.acks, err = newAcknowledger(o.cl.ControlPlane.Config, o.fleet, objectNamespace, ringName); err != nil {
		return err
	}
	// A million objects: keep only what the acknowledger reads.
	if err := o.acks.informer.SetTransform(slimObject); err != nil {
		return err
	}
	if o.creator, err = protobufClient(o.cl.ControlPlane.Config); err != nil {
		return err
	}
	if o.asSharder, err = protobufClient(o.cl.SharderUser.Config); err != nil {
		return err
	}
	for i := range o.p.instances {
		if err := o.fleet.start(ctx, instanceID(i)); err != nil {
			return err
		}
	}
	// The objects the webhook labelled before, then those the sharder
	// assigns from its watch, all before any sharder runs (so no webhook
	// is configured yet).
	labelled := o.p.objects - o.p.admittedObjects - o.p.watchedObjects
	t0 := time.Now()
	progress := o.progress(ctx, "  created", t0)
	n, _, err := o.create(ctx, 0, labelled, true)
	if err != nil {
		progress()
		return err
	}
	took := time.Since(t0)
	o.add(fmt.Sprintf("%d ConfigMaps created with the label the assigning webhook gives (%d parallel requests, no sharder running)", n, o.p.workers),
		fmt.Sprintf("%s (%.0f/s)", seconds(took), float64(n)/took.Seconds()), "", "", true)
	t0 = time.Now()
	n, _, err = o.create(ctx, labelled, labelled+o.p.watchedObjects, false)
	progress()
	if err != nil {
		return err
	}
	took = time.Since(t0)
	o.add(fmt.Sprintf("%d ConfigMaps created without a label", n), fmt.Sprintf("%s (%.0f/s)", seconds(took), float64(n)/took.Seconds()), "", "", true)
	for i := labelled; i < labelled+o.p.watchedObjects; i++ {
		o.unassigned[objectNamespace+"/"+bigObjectName(i)] = true
	}
	t0 = time.Now()
	if err := o.acks.start(ctx); err != nil {
		return err
	}
	err = localrun.Poll(ctx, 10*time.Minute, 100*time.Millisecond, func() error {
		// The watch records an object once it carries a label.
		if t := o.tally(); t.objects != o.total-len(o.unassigned) {
			return fmt.Errorf("the benchmark's watch holds %d of %d labelled objects", t.objects, o.total-len(o.unassigned))
		}
		return nil
	})
	if err != nil {
		return err
	}
	fmt.Printf("  the benchmark's watch holds the %d labelled objects after %s\n", o.total-len(o.unassigned), time.Since(t0).Round(time.Millisecond))
	return localrun.Poll(ctx, 2*time.Minute+o.p.leaseDuration, 100*time.Millisecond, func() error {
		if err := o.fleet.failure(); err != nil {
			return err
		}
		if n := o.fleet.heldCount(); n < o.p.instances {
			return fmt.Errorf("%d of %d instances hold their Lease", n, o.p.instances)
		}
		return nil
	})
}

func protobufClient(cfg *rest.Config) (kubernetes.Interface, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.QPS, cfg.Burst = -1, 0 // no client-side limit: the workers are the limit
	return kubernetes.NewForConfig(cfg)
}

// slimObject keeps what the acknowledger reads of an object.
func slimObject(obj any) (any, error) {
	m, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return obj, nil
	}
	return &metav1.PartialObjectMetadata{TypeMeta: m.TypeMeta, ObjectMeta: metav1.ObjectMeta{
		Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion, Labels: m.Labels,
	}}, nil
}

// create creates the ConfigMaps <from..to) without data and returns how
// many it created and how many of the API server's answers carried the
// ring's shard label. With labelled set, it creates them as the sharder
// with their shard label already set to the instance the ring of the
// fleet's live instances assigns them to, as the assigning webhook would
// (the API server then calls neither webhook).
func (o *objectsRun) create(ctx context.Context, from, to int, labelled bool) (created, carried int, err error) {
	var nCreated, nCarried atomic.Int64
	shard := sharderv1alpha1.ShardLabel(ringName)
	cs := o.creator
	var r ring.Ring
	opts := metav1.CreateOptions{}
	if labelled {
		cs = o.asSharder
		if r, err = o.ring(); err != nil {
			return 0, 0, err
		}
		// The validating webhook lets the sharder's label writes through
		// from the leading replica only, known by its field manager.
		if opts.FieldManager, err = o.leaderFieldManager(ctx); err != nil {
			return 0, 0, err
		}
	}
	configMaps := cs.CoreV1().ConfigMaps(objectNamespace)
	err = parallel(ctx, from, to, o.p.workers, func(i int) error {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: bigObjectName(i)}}
		if r != nil {
			id, err := r.Lookup(ring.ObjectKey(configMapKind.Group, configMapKind.Kind, objectNamespace, cm.Name))
			if err != nil {
				return err
			}
			cm.Labels = map[string]string{shard: id}
		}
		got, err := createRetrying(ctx, configMaps, cm, opts)
		if err != nil {
			return err
		}
		nCreated.Add(1)
		o.created.Add(1)
		if got.Labels[shard] != "" {
			nCarried.Add(1)
		}
		return nil
	})
	o.total += int(nCreated.Load())
	return int(nCreated.Load()), int(nCarried.Load()), err
}

// createBackoff is how often and how long a creation the API server
// refused for a while (overloaded, timed out) is tried again: a million
// creations on a busy machine meet a few such answers, and one must not end
// the run.
var createBackoff = wait.Backoff{Steps: 8, Duration: 500 * time.Millisecond, Factor: 2, Cap: 30 * time.Second}

// createRetrying creates cm, trying again on the API server's transient
// refusals. A creation whose answer was lost may have landed: when the
// next try finds the object, that object is the answer.
func createRetrying(ctx context.Context, configMaps typedcorev1.ConfigMapInterface, cm *corev1.ConfigMap, opts metav1.CreateOptions) (*corev1.ConfigMap, error) {
	var got *corev1.ConfigMap
	tried := false
	err := retry.OnError(createBackoff, transientError, func() error {
		var err error
		got, err = configMaps.Create(ctx, cm, opts)
		if apierrors.IsAlreadyExists(err) && tried {
			got, err = configMaps.Get(ctx, cm.Name, metav1.GetOptions{})
		}
		tried = true
		return err
	})
	return got, err
}

// transientError reports whether err is an answer worth trying again:
// the API server overloaded, timed out or unavailable.
func transientError(err error) bool {
	return apierrors.IsInternalError(err) || apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) ||
		apierrors.IsTooManyRequests(err) || apierrors.IsServiceUnavailable(err)
}

// leaderFieldManager returns the field manager of the sharder replica
// that leads: "sharder/" and its leader election identity.
func (o *objectsRun) leaderFieldManager(ctx context.Context) (string, error) {
	lease, err := o.creator.CoordinationV1().Leases("sharder-system").Get(ctx, "sharder", metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", nil // no sharder ran yet: no webhook checks the labels
	}
	if err != nil {
		return "", fmt.Errorf("reading the sharder's leader election Lease: %w", err)
	}
	if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
		return "", nil
	}
	return "sharder/" + *lease.Spec.HolderIdentity, nil
}

// ring returns the ring of the fleet's live instances, each with the
// default weight.
func (o *objectsRun) ring() (ring.Ring, error) {
	live := o.fleet.live()
	members := make([]ring.Member, 0, len(live))
	for _, id := range live {
		members = append(members, ring.Member{ID: id, VirtualNodes: sharderv1alpha1.DefaultVirtualNodes})
	}
	return ring.New(o.p.algorithm, members)
}

// tally is what the acknowledger's watch shows of the ring's objects.
type tally struct {
	objects, unassigned, draining int
	perInstance                   map[string]int
}

func (o *objectsRun) tally() tally {
	t := tally{perInstance: map[string]int{}}
	o.acks.mu.Lock()
	defer o.acks.mu.Unlock()
	for _, s := range o.acks.last {
		t.objects++
		if s.instance == "" {
			t.unassigned++
		} else {
			t.perInstance[s.instance]++
		}
		if s.draining {
			t.draining++
		}
	}
	return t
}

// waitAssigned waits until the watch shows o.total objects, each assigned
// and none draining.
func (o *objectsRun) waitAssigned(ctx context.Context, timeout time.Duration) error {
	return localrun.Poll(ctx, timeout, 500*time.Millisecond, func() error {
		if err := o.failure(); err != nil {
			return errors.Join(err, errStop)
		}
		t := o.tally()
		if t.objects != o.total || t.unassigned > 0 || t.draining > 0 {
			return fmt.Errorf("%d of %d objects seen, %d unassigned, %d draining", t.objects, o.total, t.unassigned, t.draining)
		}
		return nil
	})
}

// errStop marks an error that no waiting cures.
var errStop = errors.New("stopped waiting")

// failure returns an error when the sharder exited or an instance lost its
// Lease without being killed.
func (o *objectsRun) failure() error {
	if o.sharder != nil && o.sharder.Exited() {
		return fmt.Errorf("the sharder exited (%w); its log says why", o.sharder.ExitError())
	}
	return o.fleet.failure()
}

// firstStart starts the sharder on every object: it assigns those
// without a label from its watch.
func (o *objectsRun) firstStart(ctx context.Context) error {
	return o.startSharderOn(ctx, "sharder", "first start")
}

// admissionCreation turns the ring's admission mode on and creates the
// rest of the objects, each labelled by the sharder's assigning webhook in
// its create request.
func (o *objectsRun) admissionCreation(ctx context.Context) error {
	if err := o.setAssignmentMode(ctx, sharderv1alpha1.AssignmentAdmission); err != nil {
		return err
	}
	// The mode is in effect once a create comes back labelled.
	err := localrun.Poll(ctx, time.Minute, 100*time.Millisecond, func() error {
		_, labelled, err := o.create(ctx, o.total, o.total+1, false)
		if err != nil {
			return err
		}
		if labelled == 0 {
			return errors.New("created objects are not labelled at admission yet")
		}
		return nil
	})
	if err != nil {
		return err
	}
	admitted := o.p.objects - o.total
	cpu0, err := cpuTime(o.sharder.Pid())
	if err != nil {
		return err
	}
	t0 := time.Now()
	created, labelled, err := o.create(ctx, o.total, o.total+admitted, false)
	if err != nil {
		return err
	}
	took := time.Since(t0)
	cpu1, err := cpuTime(o.sharder.Pid())
	if err != nil {
		return err
	}
	o.add(fmt.Sprintf("%d ConfigMaps created in admission mode (%d parallel requests)", created, o.p.workers),
		fmt.Sprintf("%s (%.0f/s), sharder CPU %s (%.0f µs per admission)", seconds(took), float64(created)/took.Seconds(),
			seconds(cpu1-cpu0), float64((cpu1-cpu0).Microseconds())/float64(created)), "", "", true)
	o.add("  their create responses that carried the shard label", fmt.Sprintf("%d of %d", labelled, created), "", "all", labelled == created)
	return o.waitAssigned(ctx, 10*time.Minute)
}

// progress prints the objects created so far every 30 s until the
// returned function is called.
func (o *objectsRun) progress(ctx context.Context, what string, t0 time.Time) func() {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		tick := time.NewTicker(30 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				fmt.Printf("%s: %d objects after %s\n", what, o.created.Load(), time.Since(t0).Round(time.Second))
			}
		}
	}()
	return cancel
}

// restart stops the sharder, removes the shard label of a few objects
// meanwhile, and starts it again on every object.
func (o *objectsRun) restart(ctx context.Context) error {
	if err := o.sharder.Stop(30 * time.Second); err != nil {
		return fmt.Errorf("stopping the sharder: %w", err)
	}
	patch := []byte(fmt.Sprintf(`{"metadata":{"labels":{%q:null}}}`, sharderv1alpha1.ShardLabel(ringName)))
	n := min(unassignedAtRestart, o.total)
	o.unassigned = map[string]bool{}
	for i := range n {
		o.unassigned[objectNamespace+"/"+bigObjectName(i)] = true
	}
	err := parallel(ctx, 0, n, o.p.workers, func(i int) error {
		_, err := o.asSharder.CoreV1().ConfigMaps(objectNamespace).Patch(ctx, bigObjectName(i), types.MergePatchType, patch, metav1.PatchOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("removing shard labels: %w", err)
	}
	err = localrun.Poll(ctx, time.Minute, 100*time.Millisecond, func() error {
		if t := o.tally(); t.unassigned != n {
			return fmt.Errorf("%d of %d objects unassigned", t.unassigned, n)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return o.startSharderOn(ctx, "sharder-restarted", "restart")
}

// startFigures are the times of one start of the sharder, from the
// process's start, and its CPU until every object was assigned.
type startFigures struct {
	synced, first, assigned, cpu time.Duration
}

// startSharderOn starts a sharder process on every object and measures
// the time to its caches' sync and to its first decision (the first of
// o.unassigned labelled), waits until every object is assigned, and
// reads its memory.
func (o *objectsRun) startSharderOn(ctx context.Context, name, what string) error {
	var f startFigures
	t0 := time.Now()
	if err := o.startSharder(ctx, name); err != nil {
		return err
	}
	err := localrun.Poll(ctx, 10*time.Minute, 20*time.Millisecond, func() error {
		if err := o.failure(); err != nil {
			return errors.Join(err, errStop)
		}
		if !strings.Contains(o.sharder.CurrentLogs(), syncedMessage) {
			return errors.New("the ring's caches have not synced")
		}
		f.synced = time.Since(t0)
		return nil
	})
	if err != nil {
		return err
	}
	if err := o.waitAssigned(ctx, 30*time.Minute); err != nil {
		return err
	}
	events := o.acks.labelEvents(t0)
	first, ok := firstArrivalOf(events, o.unassigned)
	if !ok {
		return errors.New("no object without a label was assigned")
	}
	f.first, f.assigned = first.Sub(t0), lastEvent(events).Sub(t0)
	if f.cpu, err = cpuTime(o.sharder.Pid()); err != nil {
		return err
	}
	okStart := f.first <= targetStartUp
	o.add(fmt.Sprintf("%s on %d objects: from the sharder's start to its caches synced, and to its first decision (the first of the %d objects without a label labelled)", what, o.total, len(o.unassigned)),
		fmt.Sprintf("**%s**, **%s**", seconds(f.synced), seconds(f.first)), "", "≤ "+seconds(targetStartUp), okStart)
	// Go returns the memory of the start-up's garbage to the system
	// gradually: steady is what is left a while later.
	if err := sleep(ctx, steadyAfter); err != nil {
		return err
	}
	o.add(fmt.Sprintf("  the %d objects without a label assigned (from the sharder's start to the last label; one write each)", len(o.unassigned)),
		fmt.Sprintf("%s (%.0f/s), sharder CPU %s", seconds(f.assigned), float64(len(o.unassigned))/f.assigned.Seconds(), seconds(f.cpu)), "", "", true)
	m, err := o.sharder.Memory()
	if err != nil {
		return err
	}
	o.steadyRSS, o.peakRSS = m.RSS, m.Peak
	ratio := float64(m.Peak) / float64(m.RSS)
	o.add(fmt.Sprintf("  sharder peak RSS from its start (VmHWM) / RSS %s after every object was assigned", steadyAfter),
		fmt.Sprintf("**%.2f** (%s / %s)", ratio, mib(m.Peak), mib(m.RSS)), "", fmt.Sprintf("≤ %.1f", targetPeakToSteady), ratio <= targetPeakToSteady)
	if o.heap, err = o.liveHeap(ctx); err != nil {
		return err
	}
	perObject := o.heap / float64(o.total)
	o.add("  sharder live heap (after GC) per cached object, everything else included",
		fmt.Sprintf("**%.0f B** (%s)", perObject, mib(uint64(o.heap))), "", fmt.Sprintf("≤ %d B", targetHeapPerObject), perObject <= targetHeapPerObject)
	o.heapTop, err = o.heapProfile(ctx)
	return err
}

// firstArrivalOf returns the time of the first event that labelled one of
// the objects keys holds.
func firstArrivalOf(events []labelEvent, keys map[string]bool) (time.Time, bool) {
	for _, e := range events {
		if keys[e.key] && e.from.instance == "" && e.to.instance != "" {
			return e.at, true
		}
	}
	return time.Time{}, false
}

// scaleOut adds one instance: the sharder's CPU for the decisions (the
// pass over its caches that finds the objects to move) and for the whole
// move, and the API server's LIST requests meanwhile.
func (o *objectsRun) scaleOut(ctx context.Context) error {
	id := instanceID(o.p.instances)
	lists0, err := o.apiServerLists(ctx)
	if err != nil {
		return err
	}
	if err := o.fleet.start(ctx, id); err != nil {
		return err
	}
	// The holder creates its Lease a lease duration after finding it
	// missing: the window starts a second before.
	if err := sleep(ctx, o.p.leaseDuration-time.Second); err != nil {
		return err
	}
	prof := o.startCPUProfile(ctx, "scale-out", o.p.profileDuration)
	t0 := time.Now()
	cpu0, err := cpuTime(o.sharder.Pid())
	if err != nil {
		return err
	}
	err = localrun.Poll(ctx, 2*time.Minute, 500*time.Millisecond, func() error {
		if err := o.failure(); err != nil {
			return errors.Join(err, errStop)
		}
		if _, ok := firstMove(o.acks.labelEvents(t0), t0, nil); !ok {
			return errors.New("no object moved yet")
		}
		return nil
	})
	if err != nil {
		return err
	}
	// The whole move takes as long as the control plane needs for two
	// writes per moved object: a run on a slow machine reports how far it
	// got instead.
	settled := o.waitAssigned(ctx, moveLimit) == nil
	if err := o.failure(); err != nil {
		return err
	}
	took := time.Since(t0)
	cpu1, err := cpuTime(o.sharder.Pid())
	if err != nil {
		return err
	}
	lists1, err := o.apiServerLists(ctx)
	if err != nil {
		return err
	}
	top, err := prof.wait()
	if err != nil {
		return err
	}
	decisions, err := o.focusedCPU(ctx, "scale-out", decisionFocus)
	if err != nil {
		return err
	}
	events := o.acks.labelEvents(t0)
	moved, ok := firstMove(events, t0, nil)
	if !ok {
		return errors.New("no object moved")
	}
	lease, err := (&scale{bench: o.bench}).lease(ctx, id)
	if err != nil {
		return err
	}
	t := o.tally()
	okCPU := decisions <= targetScaleOutCPU
	o.add(fmt.Sprintf("scale-out %d → %d instances: sharder CPU of the decisions (its pass over the caches, from its CPU profile)", o.p.instances, o.p.instances+1),
		fmt.Sprintf("**%s**", seconds(decisions)), "", "≤ "+seconds(targetScaleOutCPU), okCPU)
	o.add("  LIST requests the API server served meanwhile (all clients)", fmt.Sprintf("%.0f", lists1-lists0), "", "0", lists1 == lists0)
	if lease.Spec.AcquireTime != nil {
		o.add("  from the new instance's Lease acquired to the first drain requested", seconds(moved.at.Sub(lease.Spec.AcquireTime.Time)), "", "", true)
	}
	if !settled {
		o.add(fmt.Sprintf("  the move, stopped waiting after %s: %d objects on %s, %d draining", moveLimit, t.perInstance[id], id, t.draining),
			fmt.Sprintf("sharder CPU %s", seconds(cpu1-cpu0)), "", "", true)
	} else {
		if err := o.checkPlacement(); err != nil {
			return err
		}
		o.add(fmt.Sprintf("  the whole move: %d objects drained to %s and handed over (2 writes each), every object then where the ring puts it", t.perInstance[id], id),
			fmt.Sprintf("%s, sharder CPU %s", seconds(took), seconds(cpu1-cpu0)), "", "", true)
	}
	o.profiles = append(o.profiles, profile{step: "scale-out", top: top})
	return nil
}

// checkPlacement checks that every object is on the instance the ring of
// the fleet's live instances assigns it to.
func (o *objectsRun) checkPlacement() error {
	r, err := o.ring()
	if err != nil {
		return err
	}
	o.acks.mu.Lock()
	defer o.acks.mu.Unlock()
	wrong := 0
	for key, s := range o.acks.last {
		ns, name, _ := strings.Cut(key, "/")
		want, err := r.Lookup(ring.ObjectKey(configMapKind.Group, configMapKind.Kind, ns, name))
		if err != nil {
			return err
		}
		if s.instance != want {
			wrong++
		}
	}
	if wrong > 0 {
		return fmt.Errorf("%d objects are not on the instance the ring assigns them to", wrong)
	}
	return nil
}

func bigObjectName(i int) string { return fmt.Sprintf("%s-%07d", objectsPrefix, i) }

func lastEvent(events []labelEvent) time.Time {
	var last time.Time
	for _, e := range events {
		if e.at.After(last) {
			last = e.at
		}
	}
	return last
}
