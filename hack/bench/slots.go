package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/sharder-dev/sharder/internal/localrun"
	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/instance"
	"github.com/sharder-dev/sharder/pkg/instance/leaseholder"
	"github.com/sharder-dev/sharder/pkg/slots"
)

// The slots mode (--slots) measures one ring of unit Slots (docs/design.md
// §11) in admission mode: its objects get their slot label from the
// assigning webhook at creation, and membership changes move slots by
// writes of the ring's status and the instances' Leases only. The instances
// are full instances of pkg/instance in slot mode, each a controller-runtime
// manager with a slot cache in this process, their reconcilers recording
// which slot each reconcile was for. Watches of the ring, its Leases and
// its objects count every write.

// Targets of the slots mode.
const (
	targetSlotWrites    = 10 // ring status and non-renewal Lease writes per membership change
	targetSlotHandOver  = 2 * time.Second
	targetSlotSharderMB = 64
	// slotGrace is how long after a change settled its writes are still
	// counted: a status write of the counts may trail the table.
	slotGrace = 3 * time.Second
)

var controllerRings = sharderv1alpha1.GroupVersion.WithResource("controllerrings")

// slotsRun is one run of the slots mode.
type slotsRun struct {
	*bench
	creator   kubernetes.Interface
	total     int
	created   atomic.Int64
	count     int
	ringUID   string
	rec       *slotRecorder
	mu        sync.Mutex
	instances map[string]*slotInstance
	rss       []rssAt
	// added is the instance the scale-out started (released as stopped
	// for good); the stop step stops it.
	added string
	// occupied counts the objects created per slot: a slot without
	// objects has no reconcile to time.
	occupied []atomic.Int64
	// labelsAt is when every object carried its slot label: object writes
	// are counted from then.
	labelsAt time.Time
}

type rssAt struct {
	objects int
	rss     uint64
	anon    string
	heap    float64
	load    string
}

// slotInstance is one in-process instance.
type slotInstance struct {
	inst   *instance.Instance
	cancel context.CancelFunc
	done   chan error
}

// slotRecorder holds what the watches and the reconcilers saw.
type slotRecorder struct {
	mu           sync.Mutex
	objectWrites []time.Time
	ringWrites   []time.Time
	tables       []tableAt
	leaseWrites  []time.Time // non-renewal Lease writes (creations and deletions included)
	acks         []ackAt
	renewals     int
	// reconciles holds per instance and slot the times of its reconciles.
	reconciles map[string]map[int][]time.Time
	perInst    map[string]int
}

func newSlotRecorder() *slotRecorder {
	return &slotRecorder{reconciles: map[string]map[int][]time.Time{}, perInst: map[string]int{}}
}

func (r *slotRecorder) reconciled(id string, slot int, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.reconciles[id]
	if m == nil {
		m = map[int][]time.Time{}
		r.reconciles[id] = m
	}
	m[slot] = append(m[slot], at)
	r.perInst[id]++
}

func (r *slotRecorder) firstReconcile(id string, slot int, after time.Time) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, t := range r.reconciles[id][slot] {
		if !t.Before(after) {
			return t
		}
	}
	return time.Time{}
}

func (r *slotRecorder) latestTable() (tableAt, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.tables) == 0 {
		return tableAt{}, false
	}
	return r.tables[len(r.tables)-1], true
}

// window is what the recorder saw in [from, to].
type slotWindow struct {
	objectWrites, ringWrites, leaseWrites, acks int
	tables                                      []tableAt
	acksSeen                                    []ackAt
}

func (r *slotRecorder) window(from, to time.Time) slotWindow {
	r.mu.Lock()
	defer r.mu.Unlock()
	w := slotWindow{
		objectWrites: countBetween(r.objectWrites, from, to),
		ringWrites:   countBetween(r.ringWrites, from, to),
		leaseWrites:  countBetween(r.leaseWrites, from, to),
	}
	for _, t := range r.tables {
		if !t.at.Before(from) && !t.at.After(to) {
			w.tables = append(w.tables, t)
		}
	}
	for _, a := range r.acks {
		if !a.at.Before(from) && !a.at.After(to) {
			w.acksSeen = append(w.acksSeen, a)
			w.acks++
		}
	}
	return w
}

func runSlots(ctx context.Context, p params) error {
	// The in-process instances log to instances.log beside the sharder's
	// log, once the run's folder exists: their slot tables applied,
	// acknowledgements and cache switches, for a hand-over to be followed.
	instanceLog := &lateWriter{}
	ctrl.SetLogger(zap.New(zap.WriteTo(instanceLog), zap.UseDevMode(false)))
	// The sharder's default leader election timings (client-go's): with
	// localrun's short ones, a renewal slowed by a busy machine ends the
	// sharder (as a deployed one would with them), and the run.
	p.leaderLease = 15 * time.Second
	p.revision = sourceRevision()
	p.apiServerFlags, p.etcdFlags = objectsAPIServerFlags, objectsEtcdFlags
	return onCluster(p, "sharder-bench-slots-", func(b *bench) error {
		// The folder is made when the first process starts, after this.
		if err := os.MkdirAll(b.cl.LogDir, 0o750); err != nil {
			return err
		}
		f, err := os.Create(filepath.Join(b.cl.LogDir, "instances.log"))
		if err != nil {
			return err
		}
		defer func() {
			instanceLog.set(nil)
			_ = f.Close()
		}()
		instanceLog.set(f)
		start := time.Now()
		s := &slotsRun{bench: b, rec: newSlotRecorder(), instances: map[string]*slotInstance{}, count: p.slotCount, occupied: make([]atomic.Int64, p.slotCount)}
		defer s.stopAll()
		steps := []struct {
			name string
			fn   func(context.Context) error
		}{
			{"set-up", s.setUp},
			{"scale-out", s.scaleOut},
			{"instance stopped", s.stopOne},
			{"rolling restart", s.rollingRestart},
			{"sharder memory", s.memory},
		}
		for _, st := range steps {
			fmt.Printf("%s ... (%s)\n", st.name, time.Since(start).Round(time.Second))
			if err := st.fn(ctx); err != nil {
				return fmt.Errorf("%s: %w", st.name, err)
			}
			if p.output != "" {
				s.p.loadAfter = loadAverage()
				if err := writeSlotsReport(s.p, s.report()); err != nil {
					return err
				}
			}
		}
		s.p.loadAfter = loadAverage()
		fmt.Printf("done in %s\n\n", time.Since(start).Round(time.Second))
		report := s.report()
		fmt.Print(report)
		if p.output != "" {
			if err := writeSlotsReport(s.p, report); err != nil {
				return err
			}
			fmt.Printf("\nwritten to %s\n", p.output)
		}
		return nil
	})
}

// setUp creates the ring of unit Slots in admission mode, starts the
// watches, the sharder and the instances, and creates the objects through
// the assigning webhook.
func (s *slotsRun) setUp(ctx context.Context) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: objectNamespace, Labels: map[string]string{benchLabel: "true"}}}
	if err := s.c.Create(ctx, ns); err != nil {
		return err
	}
	if err := localrun.EnsureNamespace(ctx, s.c, leaseNamespace); err != nil {
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
			Assignment: &sharderv1alpha1.RingAssignment{
				Mode:  sharderv1alpha1.AssignmentAdmission,
				Unit:  sharderv1alpha1.AssignmentUnitSlots,
				Slots: &sharderv1alpha1.RingSlots{Count: int32(s.count)}, //nolint:gosec // bounded by the CRD
			},
		},
	}
	if err := s.c.Create(ctx, r); err != nil {
		return fmt.Errorf("creating the ring: %w", err)
	}
	s.ringUID = string(r.UID)
	var err error
	if s.instUser, err = s.cl.ControlPlane.AddServiceAccountUser("instance", leaseNamespace, instanceAccount); err != nil {
		return err
	}
	if s.creator, err = protobufClient(s.cl.ControlPlane.Config); err != nil {
		return err
	}
	if err := s.startWatches(ctx); err != nil {
		return err
	}
	if n := s.p.existingObjects; n > 0 {
		t0 := time.Now()
		created, _, err := s.create(ctx, 0, n, true)
		if err != nil {
			return fmt.Errorf("creating the existing objects: %w", err)
		}
		took := time.Since(t0)
		s.add(fmt.Sprintf("%d ConfigMaps created before the sharder and the instances start, with the slot label the assigning webhook gives (%d parallel requests)", created, s.p.workers),
			fmt.Sprintf("%s (%.0f/s); load %s", seconds(took), float64(created)/took.Seconds(), loadAverage()), "", "", true)
	}
	if err := s.startSharder(ctx, "sharder"); err != nil {
		return err
	}
	for i := range s.p.instances {
		if err := s.startInstance(ctx, instanceID(i), leaseholder.ReleaseRestart); err != nil {
			return err
		}
	}
	if err := s.waitSettled(ctx, 3*time.Minute); err != nil {
		return err
	}
	// The webhook is in effect once a create comes back labelled.
	err = localrun.Poll(ctx, time.Minute, 200*time.Millisecond, func() error {
		_, labelled, err := s.create(ctx, s.total, s.total+1, false)
		if err != nil {
			return err
		}
		if labelled == 0 {
			return errors.New("created objects get no slot label at admission yet")
		}
		return nil
	})
	if err != nil {
		return err
	}
	cpu0, err := cpuTime(s.sharder.Pid())
	if err != nil {
		return err
	}
	t0 := time.Now()
	created, labelled, err := s.create(ctx, s.total, s.p.existingObjects+s.p.objects, false)
	if err != nil {
		return err
	}
	took := time.Since(t0)
	cpu1, err := cpuTime(s.sharder.Pid())
	if err != nil {
		return err
	}
	s.add(fmt.Sprintf("%d ConfigMaps created through the assigning webhook (%d parallel requests)", created, s.p.workers),
		fmt.Sprintf("%s (%.0f/s), sharder CPU %s (%.0f µs per admission); load %s", seconds(took), float64(created)/took.Seconds(),
			seconds(cpu1-cpu0), float64((cpu1-cpu0).Microseconds())/float64(max(created, 1)), loadAverage()), "", "", true)
	s.add("  their create responses that carried the slot label", fmt.Sprintf("%d of %d", labelled, created), "", "all", labelled == created)
	// Every object reconciled by the instance holding its slot: the
	// instances list the existing objects first, a minute per 100,000.
	err = localrun.Poll(ctx, 5*time.Minute+time.Duration(s.total/100000)*time.Minute, 500*time.Millisecond, func() error {
		if err := s.failure(); err != nil {
			return errors.Join(err, errStop)
		}
		if n := s.reconciledObjects(); n < s.total {
			return fmt.Errorf("%d of %d objects reconciled", n, s.total)
		}
		return nil
	})
	if err != nil {
		return err
	}
	s.labelsAt = time.Now()
	return s.recordRSS(ctx)
}

// reconciledObjects returns the reconciles recorded so far, all instances
// together (each object is reconciled at least once once its slot is held).
func (s *slotsRun) reconciledObjects() int {
	s.rec.mu.Lock()
	defer s.rec.mu.Unlock()
	n := 0
	for _, c := range s.rec.perInst {
		n += c
	}
	return n
}

// create creates the ConfigMaps <from..to) as the admin, through the
// webhook (labelledByUs: with the slot label the webhook gives already set, for
// objects created before the sharder runs), and returns how many it
// created and how many of the API server's answers carried the slot label.
func (s *slotsRun) create(ctx context.Context, from, to int, labelledByUs bool) (created, labelled int, err error) {
	var nCreated, nLabelled atomic.Int64
	label := sharderv1alpha1.SlotLabel(ringName)
	cms := s.creator.CoreV1().ConfigMaps(objectNamespace)
	spec := s.spec()
	err = parallel(ctx, from, to, s.p.workers, func(i int) error {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: bigObjectName(i)}}
		if labelledByUs {
			cm.Labels = map[string]string{label: strconv.Itoa(slots.ForMainObject(spec, "", "ConfigMap", objectNamespace, cm.Name))}
		}
		got, err := createRetrying(ctx, cms, cm, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		nCreated.Add(1)
		s.created.Add(1)
		s.occupied[slots.ForMainObject(s.spec(), "", "ConfigMap", objectNamespace, got.Name)].Add(1)
		if got.Labels[label] != "" {
			nLabelled.Add(1)
		}
		return nil
	})
	s.total += int(nCreated.Load())
	return int(nCreated.Load()), int(nLabelled.Load()), err
}

// startWatches starts the watches of the ring, its Leases and its objects.
func (s *slotsRun) startWatches(ctx context.Context) error {
	cfg := rest.CopyConfig(s.cl.ControlPlane.Config)
	cfg.QPS, cfg.Burst = -1, 0
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	leases := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(leaseNamespace)).Coordination().V1().Leases().Informer()
	_, err = leases.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) {
			s.rec.mu.Lock()
			s.rec.leaseWrites = append(s.rec.leaseWrites, time.Now())
			s.rec.mu.Unlock()
		},
		UpdateFunc: func(oldObj, newObj any) {
			old, cur := oldObj.(*coordinationv1.Lease), newObj.(*coordinationv1.Lease)
			if old.ResourceVersion == cur.ResourceVersion {
				return
			}
			now := time.Now()
			s.rec.mu.Lock()
			defer s.rec.mu.Unlock()
			if leaseRenewal(old, cur) {
				s.rec.renewals++
				return
			}
			s.rec.leaseWrites = append(s.rec.leaseWrites, now)
			if a, b := acknowledged(old, s.ringUID), acknowledged(cur, s.ringUID); b > a {
				s.rec.acks = append(s.rec.acks, ackAt{at: now, id: cur.Name, revision: b})
			}
		},
		DeleteFunc: func(any) {
			s.rec.mu.Lock()
			s.rec.leaseWrites = append(s.rec.leaseWrites, time.Now())
			s.rec.mu.Unlock()
		},
	})
	if err != nil {
		return err
	}
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	rings := dynamicinformer.NewDynamicSharedInformerFactory(dc, 0).ForResource(controllerRings).Informer()
	_, err = rings.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { s.ringSeen(nil, obj) },
		UpdateFunc: func(oldObj, newObj any) {
			s.ringSeen(oldObj, newObj)
		},
	})
	if err != nil {
		return err
	}
	mc, err := metadata.NewForConfig(cfg)
	if err != nil {
		return err
	}
	objects := metadatainformer.NewFilteredMetadataInformer(mc, configMaps, objectNamespace, 0, cache.Indexers{}, nil).Informer()
	// Only the names are kept: the counts need nothing else.
	if err := objects.SetTransform(func(obj any) (any, error) {
		if m, ok := obj.(*metav1.PartialObjectMetadata); ok {
			return &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: m.Name, Namespace: m.Namespace, ResourceVersion: m.ResourceVersion}}, nil
		}
		return obj, nil
	}); err != nil {
		return err
	}
	_, err = objects.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(oldObj, newObj any) {
			o, n := oldObj.(*metav1.PartialObjectMetadata), newObj.(*metav1.PartialObjectMetadata)
			if o.ResourceVersion == n.ResourceVersion {
				return
			}
			s.rec.mu.Lock()
			s.rec.objectWrites = append(s.rec.objectWrites, time.Now())
			s.rec.mu.Unlock()
		},
	})
	if err != nil {
		return err
	}
	for _, inf := range []cache.SharedIndexInformer{leases, rings, objects} {
		go inf.Run(ctx.Done())
	}
	if !cache.WaitForCacheSync(ctx.Done(), leases.HasSynced, rings.HasSynced, objects.HasSynced) {
		return errors.New("the benchmark's watches did not sync")
	}
	return nil
}

// ringSeen records a write of the ring and its slot table.
func (s *slotsRun) ringSeen(oldObj, newObj any) {
	cur, ok := newObj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	now := time.Now()
	if old, ok := oldObj.(*unstructured.Unstructured); ok && old.GetResourceVersion() == cur.GetResourceVersion() {
		return
	}
	var r sharderv1alpha1.ControllerRing
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(cur.Object, &r); err != nil {
		return
	}
	s.rec.mu.Lock()
	defer s.rec.mu.Unlock()
	if oldObj != nil {
		s.rec.ringWrites = append(s.rec.ringWrites, now)
	}
	if r.Status.Slots == nil {
		return
	}
	t, err := slots.FromStatus(s.count, r.Status.Slots)
	if err != nil {
		return
	}
	if n := len(s.rec.tables); n == 0 || s.rec.tables[n-1].table.Revision != t.Revision {
		s.rec.tables = append(s.rec.tables, tableAt{at: now, table: t})
	}
}

// startInstance starts an in-process instance of the ring in slot mode.
func (s *slotsRun) startInstance(ctx context.Context, id string, release leaseholder.Release) error {
	cfg := rest.CopyConfig(s.instUser.Config)
	cfg.QPS, cfg.Burst = 500, 1000
	instOpts := instance.Options{
		Ring: ringName, Identity: id,
		Lease: leaseholder.Options{
			Namespace:     leaseNamespace,
			LeaseDuration: s.p.leaseDuration,
			RenewPeriod:   s.p.leaseDuration / 5,
			Release:       release,
		},
	}
	mgr, err := ctrl.NewManager(cfg, manager.Options{
		NewCache:               instance.NewCache(instOpts, &corev1.ConfigMap{}),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		return fmt.Errorf("instance %s: %w", id, err)
	}
	inst, err := instance.Setup(mgr, instOpts)
	if err != nil {
		return fmt.Errorf("instance %s: %w", id, err)
	}
	spec := s.spec()
	r, err := inst.Wrap(&corev1.ConfigMap{}, reconcile.Func(func(_ context.Context, req reconcile.Request) (reconcile.Result, error) {
		slot := slots.ForMainObject(spec, "", "ConfigMap", req.Namespace, req.Name)
		s.rec.reconciled(id, slot, time.Now())
		return reconcile.Result{}, nil
	}))
	if err != nil {
		return err
	}
	if err := ctrl.NewControllerManagedBy(mgr).Named("bench").For(&corev1.ConfigMap{}).
		WithOptions(controllerOptions()).Complete(r); err != nil {
		return err
	}
	ictx, cancel := context.WithCancel(ctx)
	si := &slotInstance{inst: inst, cancel: cancel, done: make(chan error, 1)}
	go func() { si.done <- mgr.Start(ictx) }()
	s.mu.Lock()
	s.instances[id] = si
	s.mu.Unlock()
	return nil
}

// spec is what the slot of an object depends on in the ring's spec.
func (s *slotsRun) spec() *sharderv1alpha1.ControllerRingSpec {
	return &sharderv1alpha1.ControllerRingSpec{Assignment: &sharderv1alpha1.RingAssignment{Unit: sharderv1alpha1.AssignmentUnitSlots,
		Slots: &sharderv1alpha1.RingSlots{Count: int32(s.count)}}} //nolint:gosec // bounded by the CRD
}

// stopInstance stops an instance gracefully (it releases its Lease) and
// waits for it to return.
func (s *slotsRun) stopInstance(id string) error {
	s.mu.Lock()
	si := s.instances[id]
	delete(s.instances, id)
	s.mu.Unlock()
	if si == nil {
		return fmt.Errorf("no instance %s", id)
	}
	si.cancel()
	select {
	case err := <-si.done:
		if err != nil && !errors.Is(err, context.Canceled) {
			return fmt.Errorf("instance %s: %w", id, err)
		}
		return nil
	case <-time.After(2 * time.Minute):
		return fmt.Errorf("instance %s did not stop", id)
	}
}

func (s *slotsRun) stopAll() {
	s.mu.Lock()
	ids := make([]string, 0, len(s.instances))
	for id := range s.instances {
		ids = append(ids, id)
	}
	s.mu.Unlock()
	for _, id := range ids {
		_ = s.stopInstance(id)
	}
}

func (s *slotsRun) live() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]string, 0, len(s.instances))
	for id := range s.instances {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// failure returns an error when the sharder or an instance exited.
func (s *slotsRun) failure() error {
	if s.sharder != nil && s.sharder.Exited() {
		return fmt.Errorf("the sharder exited (%w); its log says why", s.sharder.ExitError())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, si := range s.instances {
		select {
		case err := <-si.done:
			si.done <- err
			return fmt.Errorf("instance %s stopped: %w", id, err)
		default:
		}
	}
	return nil
}

// waitSettled waits until the latest table grants every slot to the live
// instances in equal shares, none releasing, and every live instance's
// record holds exactly its granted slots.
func (s *slotsRun) waitSettled(ctx context.Context, timeout time.Duration) error {
	return localrun.Poll(ctx, timeout, 50*time.Millisecond, func() error {
		if err := s.failure(); err != nil {
			return errors.Join(err, errStop)
		}
		t, ok := s.rec.latestTable()
		if !ok {
			return errors.New("no slot table yet")
		}
		live := s.live()
		if !balanced(t.table, live) {
			return fmt.Errorf("table of revision %d not balanced over %v", t.table.Revision, live)
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, id := range live {
			rec, ok := s.instances[id].inst.SlotRecord()
			granted, _ := t.table.HeldBy(id)
			if !ok || !slices.Equal(rec.Slots, granted) {
				return fmt.Errorf("instance %s holds %d slots of the %d granted", id, len(rec.Slots), len(granted))
			}
		}
		return nil
	})
}

// change measures one membership change: do starts it; the window ends
// once the ring settled, plus slotGrace.
func (s *slotsRun) change(ctx context.Context, name string, do func() error, settleTimeout time.Duration) (slotWindow, []handOver, time.Duration, time.Duration, error) {
	before, _ := s.rec.latestTable()
	cpu0, err := cpuTime(s.sharder.Pid())
	if err != nil {
		return slotWindow{}, nil, 0, 0, err
	}
	t0 := time.Now()
	if err := do(); err != nil {
		return slotWindow{}, nil, 0, 0, err
	}
	if err := s.waitSettled(ctx, settleTimeout); err != nil {
		return slotWindow{}, nil, 0, 0, fmt.Errorf("%s: %w", name, err)
	}
	settled := time.Since(t0)
	after, _ := s.rec.latestTable()
	var moves []slotMove
	for _, m := range movedSlots(before.table, after.table) {
		if s.occupied[m.slot].Load() > 0 {
			moves = append(moves, m)
		}
	}
	// The new holders' first reconciles may come after the table settled
	// (their lists): wait for them, a minute at most (the report counts
	// the slots never reconciled).
	_ = localrun.Poll(ctx, time.Minute, 50*time.Millisecond, func() error {
		for _, m := range moves {
			if s.rec.firstReconcile(m.to, m.slot, t0).IsZero() {
				return fmt.Errorf("slot %d not reconciled by %s yet", m.slot, m.to)
			}
		}
		return nil
	})
	if err := sleep(ctx, slotGrace); err != nil {
		return slotWindow{}, nil, 0, 0, err
	}
	cpu1, err := cpuTime(s.sharder.Pid())
	if err != nil {
		return slotWindow{}, nil, 0, 0, err
	}
	w := s.rec.window(t0, time.Now())
	hs := handOvers(moves, w.tables, w.acksSeen, s.rec.firstReconcile)
	return w, hs, settled, cpu1 - cpu0, nil
}

// addChange reports one change's writes, hand-overs and CPU. list is the
// time of the new holder's list of its granted slots (the target allows
// it besides targetSlotHandOver), 0 when not measured.
func (s *slotsRun) addChange(what string, w slotWindow, hs []handOver, settled, cpu, list time.Duration, load string) {
	writes := w.ringWrites + w.leaseWrites - w.acks
	s.add(fmt.Sprintf("%s: object writes", what), fmt.Sprintf("**%d**", w.objectWrites), "", "0", w.objectWrites == 0)
	s.add("  ring status writes + Lease writes other than renewals and acknowledgements (ring + Lease); acknowledgements besides",
		fmt.Sprintf("**%d** (%d + %d); %d", writes, w.ringWrites, w.leaseWrites-w.acks, w.acks), "", fmt.Sprintf("≤ %d", targetSlotWrites), writes <= targetSlotWrites)
	s.add("  slots moved (with objects); settled after (every slot granted, records match)", fmt.Sprintf("%d; %s", len(hs), seconds(settled)), "", "", true)
	if acked, missing := latencies(hs, true); len(acked)+missing > 0 {
		ok := missing == 0 && quantile(acked, 1) <= targetSlotHandOver+list
		target := "≤ " + seconds(targetSlotHandOver)
		if list > 0 {
			target += " + its list (" + millis(list) + ", below)"
		}
		s.add("  old holder's acknowledgement → new holder's first reconcile of the slot (list included): median, max",
			fmt.Sprintf("**%s**, **%s**%s; load %s", millis(quantile(acked, 0.5)), millis(quantile(acked, 1)), missingNote(missing), load), "", target, ok)
	}
	if granted, missing := latencies(hs, false); len(granted)+missing > 0 {
		s.add("  slots with no acknowledgement (holder gone): grant → new holder's first reconcile, median, max",
			fmt.Sprintf("%s, %s%s", millis(quantile(granted, 0.5)), millis(quantile(granted, 1)), missingNote(missing)), "", "", true)
	}
	s.add("  sharder CPU for the change (until settled and every moved slot reconciled, + "+seconds(slotGrace)+")", fmt.Sprintf("%s; load %s", seconds(cpu), load), "", "", true)
}

func missingNote(n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(" (%d slots never reconciled)", n)
}

// scaleOut adds one instance.
func (s *slotsRun) scaleOut(ctx context.Context) error {
	n := len(s.live())
	id := instanceID(n)
	w, hs, settled, cpu, err := s.change(ctx, "scale-out", func() error { return s.startInstance(ctx, id, leaseholder.ReleaseStop) }, 3*time.Minute)
	if err != nil {
		return err
	}
	s.added = id
	load := loadAverage()
	l, err := s.groupLists(ctx, id)
	if err != nil {
		return err
	}
	s.addChange(fmt.Sprintf("scale-out %d → %d instances (%d objects)", n, n+1, s.total), w, hs, settled, cpu, quantile(l.batch, 0.5), load)
	s.add(fmt.Sprintf("  after it, one LIST of all of %s's slots (as its slot cache lists the groups it starts together; %d objects), 3 tries: median, max", id, l.batchItems),
		fmt.Sprintf("%s, %s; load %s", millis(quantile(l.batch, 0.5)), millis(quantile(l.batch, 1)), l.load), "", "", true)
	s.add(fmt.Sprintf("  one LIST per watch group of %s's slots (label selector, as a slot cache lists a group it starts alone; %d groups, %d objects per list on average): median, max", id, len(l.perGroup), l.groupItems/max(len(l.perGroup), 1)),
		fmt.Sprintf("%s, %s; load %s", millis(quantile(l.perGroup, 0.5)), millis(quantile(l.perGroup, 1)), l.load), "", "", true)
	return nil
}

// listTimes are the times of the lists of an instance's granted slots.
type listTimes struct {
	batch, perGroup        []time.Duration // sorted
	batchItems, groupItems int
	load                   string
}

// groupLists times, after the change, one LIST of all of the instance's
// granted slots, as its slot cache lists the groups it starts together
// (the list part of a hand-over), three times; and one LIST per watch
// group of those slots with the group's label selector, as the cache lists
// a group it starts alone.
func (s *slotsRun) groupLists(ctx context.Context, id string) (listTimes, error) {
	var l listTimes
	t, ok := s.rec.latestTable()
	if !ok {
		return l, errors.New("no slot table")
	}
	granted, _ := t.table.HeldBy(id)
	values := make([]string, 0, len(granted))
	for _, slot := range granted {
		values = append(values, strconv.Itoa(slot))
	}
	all, err := labels.NewRequirement(sharderv1alpha1.SlotLabel(ringName), selection.In, values)
	if err != nil {
		return l, err
	}
	list := func(selector string) (time.Duration, int, error) {
		t0 := time.Now()
		cms, err := s.creator.CoreV1().ConfigMaps(objectNamespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return 0, 0, err
		}
		return time.Since(t0), len(cms.Items), nil
	}
	for range 3 {
		d, n, err := list(all.String())
		if err != nil {
			return l, err
		}
		l.batch, l.batchItems = append(l.batch, d), n
	}
	sels, err := slots.GroupSelectors(sharderv1alpha1.SlotLabel(ringName), granted, s.count)
	if err != nil {
		return l, err
	}
	for _, sel := range sels {
		d, n, err := list(sel.String())
		if err != nil {
			return l, err
		}
		l.perGroup = append(l.perGroup, d)
		l.groupItems += n
	}
	slices.Sort(l.batch)
	slices.Sort(l.perGroup)
	l.load = loadAverage()
	return l, nil
}

// stopOne stops the instance the scale-out added, for good.
func (s *slotsRun) stopOne(ctx context.Context) error {
	live := s.live()
	id := s.added
	if id == "" {
		return errors.New("no instance was added")
	}
	w, hs, settled, cpu, err := s.change(ctx, "stop", func() error { return s.stopInstance(id) }, 3*time.Minute)
	if err != nil {
		return err
	}
	s.addChange(fmt.Sprintf("%s (the one added) stopped for good (Lease released, not restarting), %d → %d instances", id, len(live), len(live)-1), w, hs, settled, cpu, 0, loadAverage())
	return nil
}

// rollingRestart stops and starts again every instance, one at a time,
// with the same IDs, each once the ring settled after the previous one.
func (s *slotsRun) rollingRestart(ctx context.Context) error {
	live := s.live()
	var total slotWindow
	var all []handOver
	var cpuAll, took time.Duration
	for _, id := range live {
		w, hs, settled, cpu, err := s.change(ctx, "restart of "+id, func() error {
			if err := s.stopInstance(id); err != nil {
				return err
			}
			return s.startInstance(ctx, id, leaseholder.ReleaseRestart)
		}, 3*time.Minute)
		if err != nil {
			return err
		}
		total.objectWrites += w.objectWrites
		total.ringWrites += w.ringWrites
		total.leaseWrites += w.leaseWrites
		total.acks += w.acks
		all = append(all, hs...)
		cpuAll += cpu
		took += settled
		fmt.Printf("  %s restarted: %d ring + %d Lease writes (%d acknowledgements), %d slots moved, settled after %s\n", id, w.ringWrites, w.leaseWrites, w.acks, len(hs), seconds(settled))
	}
	s.add(fmt.Sprintf("rolling restart of the %d instances (same IDs, one at a time): object writes", len(live)), fmt.Sprintf("**%d**", total.objectWrites), "", "0", total.objectWrites == 0)
	writes := total.ringWrites + total.leaseWrites - total.acks
	per := float64(writes) / float64(len(live))
	s.add("  ring status + Lease writes other than renewals and acknowledgements (ring + Lease), all restarts; acknowledgements besides; per restart",
		fmt.Sprintf("%d (%d + %d); %d; **%.1f**", writes, total.ringWrites, total.leaseWrites-total.acks, total.acks, per), "", fmt.Sprintf("≤ %d per change", targetSlotWrites), per <= targetSlotWrites)
	s.add("  slots moved, all restarts; time to settle, all restarts", fmt.Sprintf("%d; %s", len(all), seconds(took)), "", "", true)
	s.add("  sharder CPU, all restarts", fmt.Sprintf("%s; load %s", seconds(cpuAll), loadAverage()), "", "", true)
	return nil
}

// recordRSS reads the sharder's RSS and live heap a while after its last
// work, with the ring's objects as they are.
func (s *slotsRun) recordRSS(ctx context.Context) error {
	if err := sleep(ctx, 30*time.Second); err != nil {
		return err
	}
	m, err := s.sharder.Memory()
	if err != nil {
		return err
	}
	heap, err := s.liveHeap(ctx)
	if err != nil {
		return err
	}
	s.rss = append(s.rss, rssAt{objects: s.total, rss: m.RSS, anon: rssParts(s.sharder.Pid()), heap: heap, load: loadAverage()})
	return nil
}

// memory creates --large-objects objects in all through the webhook and
// reads the sharder's RSS again.
func (s *slotsRun) memory(ctx context.Context) error {
	if s.p.largeObjects > s.total {
		t0 := time.Now()
		if _, _, err := s.create(ctx, s.total, s.p.largeObjects, false); err != nil {
			return err
		}
		fmt.Printf("  %d objects in all after %s\n", s.total, time.Since(t0).Round(time.Second))
		if err := s.recordRSS(ctx); err != nil {
			return err
		}
	}
	for i, r := range s.rss {
		ok := r.rss <= targetSlotSharderMB<<20
		label := "  the same"
		if i == 0 {
			label = "sharder RSS (VmRSS, 30 s after its last work; its anonymous and file-backed parts) and live heap after GC"
		}
		s.add(fmt.Sprintf("%s with %d objects", label, r.objects), fmt.Sprintf("**%s** (%s), heap %s; load %s", mib(r.rss), r.anon, mib(uint64(r.heap)), r.load), "", fmt.Sprintf("≤ %d MiB", targetSlotSharderMB), ok)
	}
	w := s.rec.window(s.labelsAt, time.Now())
	s.add("object writes over the whole run once the labels existed (creations not counted)", fmt.Sprintf("**%d**", w.objectWrites), "", "0", w.objectWrites == 0)
	return nil
}

// rssParts returns the anonymous and file-backed parts of a process's RSS
// (RssAnon, RssFile of /proc/<pid>/status), or "" when unreadable.
func rssParts(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return ""
	}
	return statusRSSParts(string(b))
}

// lateWriter writes to the writer set last, and discards what comes while
// none is set.
type lateWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lateWriter) set(w io.Writer) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.w = w
}

func (l *lateWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.w == nil {
		return len(b), nil
	}
	return l.w.Write(b)
}
