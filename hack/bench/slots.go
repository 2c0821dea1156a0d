package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

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
