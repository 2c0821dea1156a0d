package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

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
