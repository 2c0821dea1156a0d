package instance_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/sharder-dev/sharder/internal/fixture"
	"github.com/sharder-dev/sharder/internal/testenv"
	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/instance"
	"github.com/sharder-dev/sharder/pkg/instance/leaseholder"
	"github.com/sharder-dev/sharder/pkg/slots"
)

// slotCount is the slot count of the slot-mode tests' rings: eight slots,
// one per watch group.
const slotCount = 8

// createSlotRing creates the ring named ns, of unit Slots with slotCount
// slots, sharding the ConfigMaps of ns with its Leases in ns.
func createSlotRing(t *testing.T, ns string) *v1alpha1.ControllerRing {
	t.Helper()
	return createSlotRingOf(t, ns, slotCount)
}

// createSlotRingOf is createSlotRing with count slots.
func createSlotRingOf(t *testing.T, ns string, count int32) *v1alpha1.ControllerRing {
	t.Helper()
	ring := fixture.Ring(ns, ns, nil, fixture.InNamespace(ns), func(r *v1alpha1.ControllerRing) {
		r.Spec.Assignment = &v1alpha1.RingAssignment{
			Unit:  v1alpha1.AssignmentUnitSlots,
			Slots: &v1alpha1.RingSlots{Count: count},
		}
	})
	fixture.Create(t, env().Client, ring)
	return ring
}

// table returns a table of revision rev in which slot i is held as
// holders[i] says (absent: unassigned).
func table(rev int64, holders map[int]slots.Slot) slots.Table {
	return tableOf(slotCount, rev, holders)
}

// tableOf is table for a ring of count slots.
func tableOf(count int, rev int64, holders map[int]slots.Slot) slots.Table {
	t := slots.NewTable(count)
	t.Revision = rev
	for i, s := range holders {
		t.Slots[i] = s
	}
	return t
}

func granted(id string) slots.Slot { return slots.Slot{Holder: id} }

func releasing(id string, since int64) slots.Slot {
	return slots.Slot{Holder: id, Releasing: true, Since: since}
}

// writeTable writes t into the ring's status, as the sharder does.
func writeTable(g Gomega, ring string, t slots.Table) {
	g.Eventually(func() error {
		r := &v1alpha1.ControllerRing{}
		if err := env().Client.Get(context.Background(), client.ObjectKey{Name: ring}, r); err != nil {
			return err
		}
		r.Status.Slots = t.Status()
		return env().Client.Status().Update(context.Background(), r)
	}).Should(Succeed())
}

// createSlotConfigMap creates a ConfigMap of slot.
func createSlotConfigMap(t *testing.T, ns, ring, name string, slot int) *corev1.ConfigMap {
	t.Helper()
	return createConfigMap(t, ns, name, map[string]string{v1alpha1.SlotLabel(ring): strconv.Itoa(slot)})
}

// touchSlot changes a ConfigMap's data, so that its controllers get a request.
func touchSlot(g Gomega, cm *corev1.ConfigMap) {
	patch := fmt.Appendf(nil, `{"data":{"touched":%q}}`, time.Now().Format(time.RFC3339Nano))
	g.Expect(env().Client.Patch(context.Background(), cm.DeepCopy(), client.RawPatch(types.MergePatchType, patch))).To(Succeed())
}

// slotRecorder counts, per ConfigMap name, the requests its controller got
// and the runs of the user reconciler the instance admitted.
type slotRecorder struct {
	mu       sync.Mutex
	requests map[string]int
	runs     map[string]int
}

func (r *slotRecorder) add(m map[string]int, name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m[name]++
}

func (r *slotRecorder) requestsOf(name string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.requests[name]
}

func (r *slotRecorder) runsOf(name string) func() int {
	return func() int {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.runs[name]
	}
}

type slotInstance struct {
	inst *instance.Instance
	mgr  manager.Manager
	rec  *slotRecorder
	// lost counts the calls of OnLost; done receives what the manager
	// returned, when the instance was started to lose its Lease.
	lost atomic.Int32
	done chan error
}

func (si *slotInstance) record() slots.Record {
	r, _ := si.inst.SlotRecord()
	return r
}

// startSlotInstance starts instance id of the slot ring ns with one
// controller of ConfigMaps; hook, when set, runs in each admitted
// reconcile.
func startSlotInstance(t *testing.T, ns, id string, hook func(ctx context.Context, req reconcile.Request)) *slotInstance {
	t.Helper()
	return startSlotInstanceLosing(t, ns, id, hook, false)
}

// startSlotInstanceLosing is startSlotInstance; when mayLose, losing the
// Lease is no failure and the manager's end is reported on done.
func startSlotInstanceLosing(t *testing.T, ns, id string, hook func(ctx context.Context, req reconcile.Request), mayLose bool) *slotInstance {
	t.Helper()
	return startSlotInstanceWith(t, nil, ns, id, hook, mayLose)
}

// startSlotInstanceWith is startSlotInstanceLosing with the instance's
// manager on cfg (the admin config when nil).
func startSlotInstanceWith(t *testing.T, cfg *rest.Config, ns, id string, hook func(ctx context.Context, req reconcile.Request), mayLose bool, opts ...func(*instance.Options)) *slotInstance {
	t.Helper()
	si := &slotInstance{done: make(chan error, 1)}
	// Released: the instance acquires it at once.
	lease := fixture.InstanceLease(ns, ns, id, time.Now().Add(-time.Minute), 3*time.Second, fixture.Released)
	NewWithT(t).Expect(env().Client.Create(context.Background(), lease)).To(Succeed())

	instOpts := instance.Options{
		Ring:        ns,
		Identity:    id,
		RetryPeriod: 100 * time.Millisecond,
		// The test process must not exit: reconcilers here may model slow
		// work by ignoring their cancellation.
		OnStopOverdue: func(int) {},
		Lease: leaseholder.Options{
			Namespace:     ns,
			LeaseDuration: 3 * time.Second,
			RenewPeriod:   300 * time.Millisecond,
			OnLost: func() {
				si.lost.Add(1)
				if !mayLose {
					t.Errorf("instance %s lost its Lease", id)
				}
			},
		},
	}
	for _, o := range opts {
		o(&instOpts)
	}
	mgrOpts := env().ManagerOptions()
	mgrOpts.Cache = cache.Options{DefaultNamespaces: map[string]cache.Config{ns: {}}}
	mgrOpts.NewCache = instance.NewCache(instOpts, &corev1.ConfigMap{})
	mgrOpts.Logger = ctrl.Log.WithName(id)
	mgr := env().NewManager(t, cfg, mgrOpts)
	inst, err := instance.Setup(mgr, instOpts)
	if err != nil {
		t.Fatal(err)
	}
	rec := &slotRecorder{requests: map[string]int{}, runs: map[string]int{}}
	user := reconcile.Func(func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
		rec.add(rec.runs, req.Name)
		if hook != nil {
			hook(ctx, req)
		}
		return reconcile.Result{}, nil
	})
	wrapped, err := inst.Wrap(&corev1.ConfigMap{}, user)
	if err != nil {
		t.Fatal(err)
	}
	counting := reconcile.Func(func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
		rec.add(rec.requests, req.Name)
		return wrapped.Reconcile(ctx, req)
	})
	if err := ctrl.NewControllerManagedBy(mgr).Named("configmap").For(&corev1.ConfigMap{}).
		WithOptions(controllerOptions()).Complete(counting); err != nil {
		t.Fatal(err)
	}
	si.inst, si.mgr, si.rec = inst, mgr, rec
	if !mayLose {
		testenv.StartManager(t, mgr)
		return si
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { si.done <- mgr.Start(ctx) }()
	t.Cleanup(cancel)
	return si
}

// acknowledged returns the Lease's acknowledgement annotation.
func acknowledged(ns, id string) func() (string, error) {
	return func() (string, error) {
		l := &coordinationv1.Lease{}
		if err := env().Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: id}, l); err != nil {
			return "", err
		}
		return l.Annotations[v1alpha1.AnnotationSlotsAcknowledged], nil
	}
}

// TestSlotModeStartsFromTable: an instance starts from the table it reads
// after acquiring its Lease and reconciles exactly the objects of its
// slots; a table older than the one it acted on changes nothing.
func TestSlotModeStartsFromTable(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ns := env().Namespace(t)
	createSlotRing(t, ns)
	const id = "i-0"
	for slot := range slotCount {
		createSlotConfigMap(t, ns, ns, fmt.Sprintf("cm-%d", slot), slot)
	}
	writeTable(g, ns, table(4, map[int]slots.Slot{0: granted(id), 1: granted(id), 2: granted(id),
		3: granted("other"), 4: granted("other"), 5: releasing(id, 3)}))
	si := startSlotInstance(t, ns, id, nil)

	for slot := range 3 {
		g.Eventually(si.rec.runsOf(fmt.Sprintf("cm-%d", slot)), 20*time.Second).Should(BeNumerically(">=", 1))
	}
	g.Expect(si.record()).To(Equal(slots.Record{Revision: 4, Slots: []int{0, 1, 2}}))
	// Slot 5 releasing from it at its start: acknowledged, never taken up.
	g.Eventually(acknowledged(ns, id)).Should(Equal(slots.FormatAcknowledgement(ringUID(g, ns), 4)))
	for slot := 3; slot < slotCount; slot++ {
		g.Consistently(si.rec.runsOf(fmt.Sprintf("cm-%d", slot)), 500*time.Millisecond).Should(BeZero())
	}

	// An older table seen after a newer one changes nothing: not the
	// record, not what is reconciled.
	writeTable(g, ns, table(3, map[int]slots.Slot{6: granted(id), 7: granted(id)}))
	cm0 := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cm-0"}}
	before := si.rec.runsOf("cm-0")()
	touchSlot(g, cm0)
	g.Eventually(si.rec.runsOf("cm-0")).Should(BeNumerically(">", before), "slot 0 is still held")
	g.Consistently(si.record, time.Second).Should(Equal(slots.Record{Revision: 4, Slots: []int{0, 1, 2}}))
	g.Expect(si.rec.runsOf("cm-6")()).To(BeZero())
	g.Expect(si.rec.runsOf("cm-7")()).To(BeZero())
}

func ringUID(g Gomega, ring string) types.UID {
	r := &v1alpha1.ControllerRing{}
	g.Expect(env().Client.Get(context.Background(), client.ObjectKey{Name: ring}, r)).To(Succeed())
	return r.UID
}

// TestSlotModeRelease: the table releases a slot while a reconcile of one
// of its objects runs. The reconcile's context is cancelled (cause
// ErrSlotReleased), the acknowledgement of the table's revision lands on
// the Lease only after it returned, and no reconcile of the slot's objects
// is admitted once the table was seen, although the cache still holds
// them. Then a grant: the objects of the new slot get reconciled.
func TestSlotModeRelease(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ns := env().Namespace(t)
	createSlotRing(t, ns)
	const id = "i-0"
	createSlotConfigMap(t, ns, ns, "busy", 0)
	other := createSlotConfigMap(t, ns, ns, "other", 0)
	kept := createSlotConfigMap(t, ns, ns, "kept", 1)
	createSlotConfigMap(t, ns, ns, "new", 2)

	started := make(chan struct{}, 16)
	cancelled := make(chan error, 1)
	letGo := make(chan struct{})
	var returned sync.Once
	returnedAt := make(chan time.Time, 1)
	hook := func(ctx context.Context, req reconcile.Request) {
		if req.Name != "busy" {
			return
		}
		started <- struct{}{}
		<-ctx.Done()
		cancelled <- context.Cause(ctx)
		<-letGo // ignores its cancellation until the test lets go
		returned.Do(func() { returnedAt <- time.Now() })
	}
	writeTable(g, ns, table(1, map[int]slots.Slot{0: granted(id), 1: granted(id), 2: granted("other")}))
	si := startSlotInstance(t, ns, id, hook)
	g.Eventually(started, 20*time.Second).Should(Receive())
	g.Eventually(si.rec.runsOf("other")).Should(BeNumerically(">=", 1))
	g.Eventually(si.rec.runsOf("kept")).Should(BeNumerically(">=", 1))
	uid := ringUID(g, ns)

	// Revision 2 releases slot 0 from the instance.
	writeTable(g, ns, table(2, map[int]slots.Slot{0: releasing(id, 2), 1: granted(id), 2: granted("other")}))
	var cause error
	g.Eventually(cancelled, 10*time.Second).Should(Receive(&cause))
	g.Expect(errors.Is(cause, instance.ErrSlotReleased)).To(BeTrue(), "cause %v", cause)
	g.Expect(si.record()).To(Equal(slots.Record{Revision: 2, Slots: []int{1}}))

	// The cache still holds slot 0's objects (the acknowledgement, then the
	// switch of the cache, wait for the reconcile), yet a request for one of
	// them is not admitted.
	g.Expect(si.mgr.GetCache().Get(context.Background(), client.ObjectKeyFromObject(other), &corev1.ConfigMap{})).To(Succeed())
	runs, requests := si.rec.runsOf("other")(), si.rec.requestsOf("other")
	touchSlot(g, other)
	g.Eventually(func() int { return si.rec.requestsOf("other") }).Should(BeNumerically(">", requests))
	g.Consistently(acknowledged(ns, id), time.Second).Should(BeEmpty(), "not acknowledged while the reconcile runs")
	g.Expect(si.rec.runsOf("other")()).To(Equal(runs), "no reconcile of a released slot's object")

	close(letGo)
	var at time.Time
	g.Eventually(returnedAt).Should(Receive(&at))
	g.Eventually(acknowledged(ns, id), 5*time.Second).Should(Equal(slots.FormatAcknowledgement(uid, 2)))
	// The cache lets go of slot 0, and slot 1 is still reconciled.
	g.Eventually(func() error {
		return si.mgr.GetCache().Get(context.Background(), client.ObjectKeyFromObject(other), &corev1.ConfigMap{})
	}, 10*time.Second).ShouldNot(Succeed())
	before := si.rec.runsOf("kept")()
	touchSlot(g, kept)
	g.Eventually(si.rec.runsOf("kept")).Should(BeNumerically(">", before))
	g.Expect(si.rec.runsOf("other")()).To(Equal(runs))
	g.Expect(si.rec.runsOf("busy")()).To(Equal(1))

	// Revision 3 grants slot 2 (the sharder saw the acknowledgement and
	// gave slot 0 to another instance).
	g.Expect(si.rec.runsOf("new")()).To(BeZero())
	writeTable(g, ns, table(3, map[int]slots.Slot{0: granted("other"), 1: granted(id), 2: granted(id)}))
	g.Eventually(si.rec.runsOf("new"), 10*time.Second).Should(BeNumerically(">=", 1))
	g.Expect(si.record()).To(Equal(slots.Record{Revision: 3, Slots: []int{1, 2}}))
	g.Consistently(si.rec.runsOf("other"), 500*time.Millisecond).Should(Equal(runs))
	// Nothing more to acknowledge.
	g.Expect(acknowledged(ns, id)()).To(Equal(slots.FormatAcknowledgement(uid, 2)))
}

// selectorValve stalls, while shut, the reads of one connection to the API
// server whose label selector is selector: the list, or the watch that
// streams the initial list, of a new watch group's cache, as a list that
// takes long on a loaded API server would. Every other request passes.
type selectorValve struct {
	selector string
	mu       sync.Mutex
	flowing  chan struct{} // closed while the valve is open
	stalled  int           // requests that met the valve shut
}

func newSelectorValve(selector string) *selectorValve {
	v := &selectorValve{selector: selector, flowing: make(chan struct{})}
	close(v.flowing)
	return v
}

func (v *selectorValve) shut() {
	v.mu.Lock()
	defer v.mu.Unlock()
	select {
	case <-v.flowing:
		v.flowing = make(chan struct{})
	default:
	}
}

func (v *selectorValve) open() {
	v.mu.Lock()
	defer v.mu.Unlock()
	select {
	case <-v.flowing:
	default:
		close(v.flowing)
	}
}

// held returns how many requests met the valve shut.
func (v *selectorValve) held() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.stalled
}

// wrap is a rest.Config WrapTransport.
func (v *selectorValve) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		q := req.URL.Query()
		if req.Method != http.MethodGet || q.Get("labelSelector") != v.selector {
			return rt.RoundTrip(req)
		}
		v.mu.Lock()
		flowing := v.flowing
		select {
		case <-flowing:
		default:
			v.stalled++
		}
		v.mu.Unlock()
		select {
		case <-flowing:
		case <-req.Context().Done():
			return nil, req.Context().Err()
		}
		return rt.RoundTrip(req)
	})
}

// TestSlotModeSlotBackBeforeTheCacheLetGo: the table releases a slot and
// then gives it back to the instance (a withdrawn release) before the
// instance's cache let go of the slot: the cache is busy switching to a slot
// granted just before, whose first list is slow (stalled here). A change of
// one of the slot's objects made while the slot was away was requested and
// not admitted; once the slot is back, the object is reconciled by the
// instance, although it never left the cache and does not change again.
func TestSlotModeSlotBackBeforeTheCacheLetGo(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ns := env().Namespace(t)
	createSlotRing(t, ns)
	const id = "i-0"
	away := createSlotConfigMap(t, ns, ns, "away", 0)
	createSlotConfigMap(t, ns, ns, "kept", 1)
	createSlotConfigMap(t, ns, ns, "new", 2)

	// slotCount is 8: one slot per watch group, so slot 2's group has a
	// selector of its own.
	valve := newSelectorValve(v1alpha1.SlotLabel(ns) + " in (2)")
	cfg := rest.CopyConfig(env().Config)
	cfg.Wrap(valve.wrap)
	t.Cleanup(valve.open) // before the instance stops
	writeTable(g, ns, table(1, map[int]slots.Slot{0: granted(id), 1: granted(id), 2: granted("other")}))
	si := startSlotInstanceWith(t, cfg, ns, id, nil, false)
	g.Eventually(si.rec.runsOf("away"), 20*time.Second).Should(BeNumerically(">=", 1))
	g.Eventually(si.rec.runsOf("kept")).Should(BeNumerically(">=", 1))
	uid := ringUID(g, ns)

	// Revision 2 grants slot 2: the cache's switch to it waits for the
	// group's list, which the valve holds.
	valve.shut()
	writeTable(g, ns, table(2, map[int]slots.Slot{0: granted(id), 1: granted(id), 2: granted(id)}))
	g.Eventually(valve.held, 10*time.Second).Should(BeNumerically(">=", 1))

	// Revision 3 releases slot 0; the instance lets go of it in its record
	// and acknowledges, while its cache still holds the slot's objects.
	writeTable(g, ns, table(3, map[int]slots.Slot{0: releasing(id, 3), 1: granted(id), 2: granted(id)}))
	g.Eventually(acknowledged(ns, id), 10*time.Second).Should(Equal(slots.FormatAcknowledgement(uid, 3)))
	g.Expect(si.record()).To(Equal(slots.Record{Revision: 3, Slots: []int{1, 2}}))
	runs, requests := si.rec.runsOf("away")(), si.rec.requestsOf("away")
	touchSlot(g, away)
	g.Eventually(func() int { return si.rec.requestsOf("away") }, 10*time.Second).Should(BeNumerically(">", requests))
	g.Expect(si.rec.runsOf("away")()).To(Equal(runs), "no reconcile while the slot is away")

	// Revision 4 gives slot 0 back (to the instance, a withdrawn release
	// and a new grant are the same), then the switch to slot 2 goes on.
	writeTable(g, ns, table(4, map[int]slots.Slot{0: granted(id), 1: granted(id), 2: granted(id)}))
	g.Eventually(si.record, 10*time.Second).Should(Equal(slots.Record{Revision: 4, Slots: []int{0, 1, 2}}))
	valve.open()
	g.Eventually(si.rec.runsOf("new"), 20*time.Second).Should(BeNumerically(">=", 1))
	g.Eventually(si.rec.runsOf("away"), 20*time.Second).Should(BeNumerically(">", runs),
		"the change made while slot 0 was away is reconciled once the slot is back")
}

// listLog records when the LISTs (not watches) of ConfigMaps were sent,
// by label selector.
type listLog struct {
	mu  sync.Mutex
	sel map[string][]time.Time
}

// wrap is a rest.Config WrapTransport.
func (l *listLog) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		q := req.URL.Query()
		if req.Method == http.MethodGet && strings.HasSuffix(req.URL.Path, "/configmaps") && q.Get("watch") != "true" {
			l.mu.Lock()
			if l.sel == nil {
				l.sel = map[string][]time.Time{}
			}
			l.sel[q.Get("labelSelector")] = append(l.sel[q.Get("labelSelector")], time.Now())
			l.mu.Unlock()
		}
		return rt.RoundTrip(req)
	})
}

// of returns the times of the LISTs with selector.
func (l *listLog) of(selector string) []time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.sel[selector])
}

// TestSlotModeReleasedSlotLingers: a released slot whose watch group keeps
// another slot of the instance lingers in the cache for SlotCacheLinger, so
// that the group is not listed again during the hand-over: the release is
// acknowledged at once, the slot's objects are not reconciled meanwhile,
// a slot given back while it lingers is reconciled again without a list,
// and once the linger is over the group is listed without the slot.
func TestSlotModeReleasedSlotLingers(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ns := env().Namespace(t)
	const count = 128 // 64 watch groups of two slots: slots 0 and 1 form group 0
	createSlotRingOf(t, ns, count)
	const id = "i-0"
	createSlotConfigMap(t, ns, ns, "kept", 0)
	away := createSlotConfigMap(t, ns, ns, "away", 1)
	var lists listLog
	cfg := rest.CopyConfig(env().Config)
	cfg.Wrap(lists.wrap)
	// Long enough that the steps up to the give-back (rev 3) fit in it on
	// a loaded machine.
	const linger = 10 * time.Second
	writeTable(g, ns, tableOf(count, 1, map[int]slots.Slot{0: granted(id), 1: granted(id)}))
	si := startSlotInstanceWith(t, cfg, ns, id, nil, false, func(o *instance.Options) { o.SlotCacheLinger = linger })
	g.Eventually(si.rec.runsOf("kept"), 20*time.Second).Should(BeNumerically(">=", 1))
	g.Eventually(si.rec.runsOf("away")).Should(BeNumerically(">=", 1))
	uid := ringUID(g, ns)
	both := v1alpha1.SlotLabel(ns) + " in (0,1)"
	onlyKept := v1alpha1.SlotLabel(ns) + " in (0)"
	g.Expect(lists.of(both)).To(HaveLen(1))

	// Revision 2 releases slot 1: acknowledged at once; the group keeps
	// its cache, and the slot's objects are not reconciled.
	writeTable(g, ns, tableOf(count, 2, map[int]slots.Slot{0: granted(id), 1: releasing(id, 2)}))
	g.Eventually(acknowledged(ns, id), 10*time.Second).Should(Equal(slots.FormatAcknowledgement(uid, 2)))
	acked := time.Now()
	g.Consistently(func() []time.Time { return lists.of(onlyKept) }, 2*time.Second).Should(BeEmpty(),
		"the group was listed again at once")
	g.Expect(si.mgr.GetCache().Get(context.Background(), client.ObjectKeyFromObject(away), &corev1.ConfigMap{})).To(Succeed())
	runs, requests := si.rec.runsOf("away")(), si.rec.requestsOf("away")
	touchSlot(g, away)
	g.Eventually(func() int { return si.rec.requestsOf("away") }).Should(BeNumerically(">", requests))
	g.Expect(si.rec.runsOf("away")()).To(Equal(runs), "no reconcile of a lingering slot's object")

	// Revision 3 gives slot 1 back while it lingers: its objects are
	// reconciled again, with no list.
	writeTable(g, ns, tableOf(count, 3, map[int]slots.Slot{0: granted(id), 1: granted(id)}))
	g.Eventually(si.rec.runsOf("away"), 10*time.Second).Should(BeNumerically(">", runs))
	g.Expect(lists.of(both)).To(HaveLen(1))

	// Revision 4 releases it again; once the linger is over, the group is
	// listed without it, and the cache lets go of its objects.
	writeTable(g, ns, tableOf(count, 4, map[int]slots.Slot{0: granted(id), 1: releasing(id, 4)}))
	g.Eventually(acknowledged(ns, id), 10*time.Second).Should(Equal(slots.FormatAcknowledgement(uid, 4)))
	g.Eventually(func() []time.Time { return lists.of(onlyKept) }, 3*linger).Should(HaveLen(1))
	g.Expect(lists.of(onlyKept)[0]).To(BeTemporally(">=", acked.Add(linger-time.Second)), "listed before the linger was over")
	g.Eventually(func() error {
		return si.mgr.GetCache().Get(context.Background(), client.ObjectKeyFromObject(away), &corev1.ConfigMap{})
	}, 10*time.Second).ShouldNot(Succeed())
	before := si.rec.runsOf("away")()
	touchSlot(g, away)
	g.Consistently(si.rec.runsOf("away"), 500*time.Millisecond).Should(Equal(before))
	g.Expect(lists.of(both)).To(HaveLen(1))
}

// TestSlotModeMismatch: a manager whose cache does not fit the ring's unit
// is refused with ErrModeMismatch, when the manager is created or at Setup.
func TestSlotModeMismatch(t *testing.T) {
	t.Parallel()
	ns := env().Namespace(t)
	slotRing := createSlotRing(t, ns)
	objectRing := fixture.Ring(ns+"-objects", ns, nil, fixture.InNamespace(ns))
	fixture.Create(t, env().Client, objectRing)
	opts := func(ring string) instance.Options {
		return instance.Options{Ring: ring, Identity: "i-0", Lease: leaseholder.Options{Namespace: ns}}
	}

	t.Run("slot ring, object cache", func(t *testing.T) {
		g := NewWithT(t)
		mgrOpts := env().ManagerOptions()
		mgrOpts.Cache = cache.Options{ByObject: map[client.Object]cache.ByObject{
			&corev1.ConfigMap{}: {Label: instance.Selector(slotRing.Name, "i-0")}}}
		_, err := instance.Setup(env().NewManager(t, nil, mgrOpts), opts(slotRing.Name))
		g.Expect(err).To(MatchError(instance.ErrModeMismatch))
		g.Expect(err.Error()).To(ContainSubstring("assigns Slots"))
	})
	t.Run("object ring, slot cache", func(t *testing.T) {
		g := NewWithT(t)
		mgrOpts := env().ManagerOptions()
		mgrOpts.NewCache = instance.NewCache(opts(objectRing.Name), &corev1.ConfigMap{})
		mgr, err := manager.New(env().Config, mgrOpts)
		g.Expect(err).NotTo(HaveOccurred())
		_, isSlotCache := instance.SlotCacheOf(mgr)
		g.Expect(isSlotCache).To(BeFalse(), "NewCache made a slot cache for a ring of unit Objects")

		mgrOpts.NewCache = instance.NewSlotCacheFunc(objectRing.Name, slotCount, &corev1.ConfigMap{})
		_, err = instance.Setup(env().NewManager(t, nil, mgrOpts), opts(objectRing.Name))
		g.Expect(err).To(MatchError(instance.ErrModeMismatch))
		g.Expect(err.Error()).To(ContainSubstring("assigns Objects"))
	})
	t.Run("slot count", func(t *testing.T) {
		g := NewWithT(t)
		mgrOpts := env().ManagerOptions()
		mgrOpts.NewCache = instance.NewSlotCacheFunc(slotRing.Name, 2*slotCount, &corev1.ConfigMap{})
		_, err := instance.Setup(env().NewManager(t, nil, mgrOpts), opts(slotRing.Name))
		g.Expect(err).To(MatchError(instance.ErrModeMismatch))
		g.Expect(err.Error()).To(ContainSubstring("16"))
	})
	t.Run("other ring's slot cache", func(t *testing.T) {
		g := NewWithT(t)
		mgrOpts := env().ManagerOptions()
		mgrOpts.NewCache = instance.NewCache(opts(slotRing.Name), &corev1.ConfigMap{})
		_, err := instance.Setup(env().NewManager(t, nil, mgrOpts), opts(objectRing.Name))
		g.Expect(err).To(MatchError(instance.ErrModeMismatch))
	})
	t.Run("other ring's object cache", func(t *testing.T) {
		g := NewWithT(t)
		mgrOpts := env().ManagerOptions()
		mgrOpts.NewCache = instance.NewCache(opts(objectRing.Name), &corev1.ConfigMap{})
		_, err := instance.Setup(env().NewManager(t, nil, mgrOpts), opts(slotRing.Name))
		g.Expect(err).To(MatchError(instance.ErrModeMismatch))
	})
	t.Run("no ring", func(t *testing.T) {
		g := NewWithT(t)
		mgrOpts := env().ManagerOptions()
		missing := opts(ns + "-missing")
		missing.ShardedListAndWatch = true
		mgrOpts.NewCache = instance.NewCache(missing, &corev1.ConfigMap{})
		_, err := manager.New(env().Config, mgrOpts)
		g.Expect(err).To(MatchError(ContainSubstring("reading the ring")))
	})
}

// TestSlotModeLeaseLossAndRestart: an instance that loses its Lease drops
// its record and stops; the next process with its ID starts from the table
// it reads after acquiring the Lease, not from what the last one held.
func TestSlotModeLeaseLossAndRestart(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ns := env().Namespace(t)
	createSlotRing(t, ns)
	const id = "i-0"
	createSlotConfigMap(t, ns, ns, "cm-0", 0)
	createSlotConfigMap(t, ns, ns, "cm-1", 1)
	writeTable(g, ns, table(1, map[int]slots.Slot{0: granted(id), 1: granted("other")}))
	first := startSlotInstanceLosing(t, ns, id, nil, true)
	g.Eventually(first.rec.runsOf("cm-0"), 20*time.Second).Should(BeNumerically(">=", 1))

	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: id}}
	g.Expect(env().Client.Delete(context.Background(), lease)).To(Succeed())
	var err error
	g.Eventually(first.done, 10*time.Second).Should(Receive(&err))
	g.Expect(err).To(MatchError(instance.ErrLeaseLost))
	g.Expect(first.lost.Load()).To(BeEquivalentTo(1))
	g.Expect(first.record()).To(Equal(slots.Record{}), "the record goes with the Lease")

	// Meanwhile the sharder granted slot 0 away and slot 1 here.
	writeTable(g, ns, table(3, map[int]slots.Slot{0: granted("other"), 1: granted(id)}))
	second := startSlotInstance(t, ns, id, nil)
	g.Eventually(second.rec.runsOf("cm-1"), 20*time.Second).Should(BeNumerically(">=", 1))
	g.Expect(second.record()).To(Equal(slots.Record{Revision: 3, Slots: []int{1}}))
	g.Consistently(second.rec.runsOf("cm-0"), 500*time.Millisecond).Should(BeZero())
}

// TestSlotModeObjectLeavingItsSlotCancels: the slot label policy forbids
// changing an object's slot, but it is not there from the first moment (its
// binding is written with the ring's first table) and a cluster
// administrator can bypass it. An object whose slot label is changed to a
// slot the instance does not hold leaves its view, and its reconciles in
// flight are cancelled (cause ErrMoved) rather than left running beside the
// new slot's holder; the reconcile of a deleted object runs on (it may be
// finishing the deletion).
func TestSlotModeObjectLeavingItsSlotCancels(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ns := env().Namespace(t)
	createSlotRing(t, ns)
	const id = "i-0"
	moved := createSlotConfigMap(t, ns, ns, "moved", 0)
	deleted := createSlotConfigMap(t, ns, ns, "deleted", 0)

	started := make(chan string, 16)
	causes := make(chan error, 2)
	letGo := make(chan struct{})
	hook := func(ctx context.Context, req reconcile.Request) {
		started <- req.Name
		select {
		case <-ctx.Done():
			causes <- fmt.Errorf("%s: %w", req.Name, context.Cause(ctx))
		case <-letGo:
		}
	}
	writeTable(g, ns, table(1, map[int]slots.Slot{0: granted(id), 1: granted("other")}))
	startSlotInstance(t, ns, id, hook)
	t.Cleanup(func() { close(letGo) }) // before the instance stops
	running := map[string]bool{}
	for len(running) < 2 {
		var name string
		g.Eventually(started, 20*time.Second).Should(Receive(&name))
		running[name] = true
	}

	// Slot 1 is another instance's: the moved object leaves the view and
	// its reconcile is cancelled.
	patch := fmt.Appendf(nil, `{"metadata":{"labels":{%q:"1"}}}`, v1alpha1.SlotLabel(ns))
	g.Expect(env().Client.Patch(context.Background(), moved.DeepCopy(), client.RawPatch(types.MergePatchType, patch))).To(Succeed())
	var cause error
	g.Eventually(causes, 10*time.Second).Should(Receive(&cause))
	g.Expect(cause.Error()).To(HavePrefix("moved: "))
	g.Expect(errors.Is(cause, instance.ErrMoved)).To(BeTrue(), "cause %v", cause)

	// A deleted object's reconcile is not cancelled.
	g.Expect(env().Client.Delete(context.Background(), deleted.DeepCopy())).To(Succeed())
	g.Consistently(causes, 2*time.Second).ShouldNot(Receive(), "the reconcile of a deleted object was cancelled")
}
