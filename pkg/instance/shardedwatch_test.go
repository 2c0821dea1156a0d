package instance_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
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
	"github.com/sharder-dev/sharder/pkg/instance/internal/slotcache"
	"github.com/sharder-dev/sharder/pkg/instance/leaseholder"
	"github.com/sharder-dev/sharder/pkg/slots"
)

// gatedSuite is a control plane whose API server filters lists and watches
// by shard selector (Kubernetes 1.36's ShardedListAndWatch gate, off by
// default); the package's other tests run on one without the gate.
var gatedSuite testenv.Suite

func gatedEnv() *testenv.Env { return gatedSuite.Env() }

// gatedOptions are gatedSuite's options, set by TestMain.
func gatedOptions(opts testenv.Options) testenv.Options {
	opts.APIServerFlags = map[string]string{"feature-gates": "ShardedListAndWatch=true"}
	return opts
}

// shardedFixture is a ring of key Namespace with slotCount slots sharding
// the ConfigMaps of one namespace per slot (nsOf), each holding a ConfigMap
// "cm-<slot>" created without a slot label, as if the sharder had not
// labelled it yet. Every object of the test carries the label test=<home>,
// and the instances' caches select it, so that the tests sharing an API
// server see each other's objects in no cache.
type shardedFixture struct {
	env  *testenv.Env
	home string // the ring's name and the Leases' namespace
	nsOf [slotCount]string
	cms  [slotCount]*corev1.ConfigMap
}

const testLabel = "sharder.dev/test"

func newShardedFixture(t *testing.T, e *testenv.Env) *shardedFixture {
	t.Helper()
	f := &shardedFixture{env: e, home: e.Namespace(t)}
	ring := fixture.Ring(f.home, f.home, nil, fixture.InNamespace(f.home), func(r *v1alpha1.ControllerRing) {
		r.Spec.Assignment = &v1alpha1.RingAssignment{
			Unit:  v1alpha1.AssignmentUnitSlots,
			Slots: &v1alpha1.RingSlots{Count: slotCount, Key: v1alpha1.SlotKeyNamespace},
		}
	})
	fixture.Create(t, e.Client, ring)
	// One namespace per slot, named after home: the slot of a namespace is
	// the FNV-1a hash of its name.
	found := 0
	for i := 0; found < slotCount; i++ {
		name := fmt.Sprintf("%s-%d", f.home, i)
		if slot := slots.ForNamespace(name, slotCount); f.nsOf[slot] == "" {
			f.nsOf[slot] = name
			found++
		}
	}
	for slot, name := range f.nsOf {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{testLabel: f.home}}}
		fixture.Create(t, e.Client, ns)
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: name, Name: fmt.Sprintf("cm-%d", slot),
			Labels: map[string]string{testLabel: f.home}}}
		if err := e.Client.Create(context.Background(), cm); err != nil {
			t.Fatal(err)
		}
		f.cms[slot] = cm
	}
	return f
}

// writeTable writes t into the ring's status, as the sharder does.
func (f *shardedFixture) writeTable(g Gomega, t slots.Table) {
	g.Eventually(func() error {
		r := &v1alpha1.ControllerRing{}
		if err := f.env.Client.Get(context.Background(), client.ObjectKey{Name: f.home}, r); err != nil {
			return err
		}
		r.Status.Slots = t.Status()
		return f.env.Client.Status().Update(context.Background(), r)
	}).Should(Succeed())
}

// touch changes a ConfigMap's data, so that its controller gets a request.
func (f *shardedFixture) touch(g Gomega, slot int) {
	cm := f.cms[slot].DeepCopy()
	g.Eventually(func() error {
		if err := f.env.Client.Get(context.Background(), client.ObjectKeyFromObject(cm), cm); err != nil {
			return err
		}
		cm.Data = map[string]string{"touched": time.Now().Format(time.RFC3339Nano)}
		return f.env.Client.Update(context.Background(), cm)
	}).Should(Succeed())
}

// shardRequests records the shard selectors of an instance's lists and
// watches of ConfigMaps (requests of the collection, not of one object).
type shardRequests struct {
	mu        sync.Mutex
	selectors map[string]int // shardSelector ("" when none) -> requests
}

func (r *shardRequests) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		if req.Method == http.MethodGet && strings.HasSuffix(req.URL.Path, "/configmaps") {
			r.mu.Lock()
			r.selectors[req.URL.Query().Get("shardSelector")]++
			r.mu.Unlock()
		}
		return rt.RoundTrip(req)
	})
}

// seen returns the distinct shard selectors sent, sorted.
func (r *shardRequests) seen() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, 0, len(r.selectors))
	for s := range r.selectors {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// shardedInstance is an instance of a shardedFixture's ring selecting its
// slots by shard, with one controller of ConfigMaps whose runs go to rec.
type shardedInstance struct {
	id       string
	inst     *instance.Instance
	mgr      manager.Manager
	cache    *slotcache.Cache
	requests *shardRequests
}

// startShardedInstance starts instance id; hook, when set, runs in each
// admitted reconcile.
func startShardedInstance(t *testing.T, f *shardedFixture, id string, rec *recorder, hook func(ctx context.Context, req reconcile.Request)) *shardedInstance {
	t.Helper()
	e := f.env
	lease := fixture.InstanceLease(f.home, f.home, id, time.Now().Add(-time.Minute), 3*time.Second, fixture.Released)
	NewWithT(t).Expect(e.Client.Create(context.Background(), lease)).To(Succeed())

	si := &shardedInstance{id: id, requests: &shardRequests{selectors: map[string]int{}}}
	cfg := rest.CopyConfig(e.Config)
	cfg.Wrap(si.requests.wrap)
	mgrOpts := e.ManagerOptions()
	mgrOpts.Cache = cache.Options{DefaultLabelSelector: labels.SelectorFromSet(labels.Set{testLabel: f.home})}
	instOpts := instance.Options{
		Ring:                f.home,
		Identity:            id,
		RetryPeriod:         100 * time.Millisecond,
		OnStopOverdue:       func(int) {}, // the test process must not exit
		ShardedListAndWatch: true,
		Lease: leaseholder.Options{
			Namespace:     f.home,
			LeaseDuration: 3 * time.Second,
			RenewPeriod:   300 * time.Millisecond,
			OnLost:        func() { t.Errorf("instance %s lost its Lease", id) },
		},
	}
	mgrOpts.NewCache = instance.NewCache(instOpts, &corev1.ConfigMap{})
	mgrOpts.Logger = ctrl.Log.WithName(id)
	mgr := e.NewManager(t, cfg, mgrOpts)
	inst, err := instance.Setup(mgr, instOpts)
	if err != nil {
		t.Fatal(err)
	}
	c := mgr.GetClient()
	user := reconcile.Func(func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
		iv := interval{instance: id, controller: "a", start: time.Now()}
		defer func() {
			iv.end = time.Now()
			rec.run(req.Name, iv)
		}()
		if err := c.Get(ctx, req.NamespacedName, &corev1.ConfigMap{}); err != nil {
			iv.notFound = apierrors.IsNotFound(err)
			return reconcile.Result{}, client.IgnoreNotFound(err)
		}
		if hook != nil {
			hook(ctx, req)
		}
		return reconcile.Result{}, nil
	})
	wrapped, err := inst.Wrap(&corev1.ConfigMap{}, user)
	if err != nil {
		t.Fatal(err)
	}
	if err := ctrl.NewControllerManagedBy(mgr).Named("configmap").For(&corev1.ConfigMap{}).
		WithOptions(controllerOptions()).Complete(wrapped); err != nil {
		t.Fatal(err)
	}
	sc, ok := mgr.GetCache().(*slotcache.Cache)
	if !ok {
		t.Fatalf("the manager's cache is a %T, not a slot cache", mgr.GetCache())
	}
	si.inst, si.mgr, si.cache = inst, mgr, sc
	testenv.StartManager(t, mgr)
	return si
}

// runsBy returns how often si reconciled the ConfigMap of slot.
func runsBy(rec *recorder, si *shardedInstance, slot int) func() int {
	return func() int { return len(rec.runsOf(fmt.Sprintf("cm-%d", slot), si.id)) }
}

// cached reports whether the instance's cache holds the ConfigMap of slot.
func (si *shardedInstance) cached(f *shardedFixture, slot int) func() error {
	return func() error {
		return si.cache.Get(context.Background(), client.ObjectKeyFromObject(f.cms[slot]), &corev1.ConfigMap{})
	}
}

// selectorsOf returns the shard selectors of the watch groups of held
// (slotCount is 8: a group per slot), sorted.
func selectorsOf(held ...int) []string {
	var out []string
	for _, s := range held {
		out = append(out, slots.ShardSelector([]int{s}, slotCount).String())
	}
	slices.Sort(out)
	return out
}

// checkSplit: two instances selecting by shard, i-0 holding slots 0-3 and
// i-1 slots 4-7, each reconcile exactly the ConfigMaps of their slots,
// although no ConfigMap carries a slot label, and hold no other in their
// caches; every list and watch of ConfigMaps they sent carried the shard
// selector of one of their watch groups.
func checkSplit(t *testing.T, f *shardedFixture) (rec *recorder, first, second *shardedInstance) {
	t.Helper()
	g := NewWithT(t)
	rec = newRecorder()
	f.writeTable(g, table(1, map[int]slots.Slot{0: granted("i-0"), 1: granted("i-0"), 2: granted("i-0"), 3: granted("i-0"),
		4: granted("i-1"), 5: granted("i-1"), 6: granted("i-1"), 7: granted("i-1")}))
	first = startShardedInstance(t, f, "i-0", rec, nil)
	second = startShardedInstance(t, f, "i-1", rec, nil)
	holder := func(slot int) (*shardedInstance, *shardedInstance) {
		if slot < 4 {
			return first, second
		}
		return second, first
	}
	for slot := range slotCount {
		in, _ := holder(slot)
		g.Eventually(runsBy(rec, in, slot), 30*time.Second).Should(BeNumerically(">=", 1), "slot %d", slot)
	}
	for slot := range slotCount {
		in, out := holder(slot)
		g.Expect(in.cached(f, slot)()).To(Succeed(), "slot %d in its holder's cache", slot)
		g.Expect(apierrors.IsNotFound(out.cached(f, slot)())).To(BeTrue(), "slot %d in no other cache", slot)
	}
	g.Consistently(func() []string {
		var out []string
		for slot := range slotCount {
			_, other := holder(slot)
			if n := runsBy(rec, other, slot)(); n > 0 {
				out = append(out, fmt.Sprintf("slot %d reconciled %d times by %s", slot, n, other.id))
			}
		}
		return out
	}, time.Second).Should(BeEmpty())
	g.Expect(first.requests.seen()).To(Equal(selectorsOf(0, 1, 2, 3)))
	g.Expect(second.requests.seen()).To(Equal(selectorsOf(4, 5, 6, 7)))
	return rec, first, second
}

// TestShardedWatchGatedServer: on an API server with the ShardedListAndWatch
// gate, instances selecting their slots by shard reconcile the objects of
// their slots before these carry a slot label, each only its own, and the
// server filtered: every object it returned to an instance's watches
// (lists and watch events) was of the instance's slots.
func TestShardedWatchGatedServer(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	f := newShardedFixture(t, gatedEnv())
	_, first, second := checkSplit(t, f)
	for _, si := range []*shardedInstance{first, second} {
		stats := si.cache.ShardStats()
		t.Logf("%s: %+v", si.id, stats)
		g.Expect(stats.Received).To(BeNumerically(">=", slotCount/2), "%s received its objects", si.id)
		g.Expect(stats.OutsideSlots).To(BeZero(), "%s received objects of other slots: the server did not filter", si.id)
	}
}

// TestShardedWatchServerWithoutGate: an API server without the gate ignores
// the shard selector and returns every object; the instances still hold and
// reconcile only the objects of their slots, checking each object's slot
// from its namespace.
func TestShardedWatchServerWithoutGate(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	f := newShardedFixture(t, env())
	_, first, second := checkSplit(t, f)
	for _, si := range []*shardedInstance{first, second} {
		t.Logf("%s: %+v", si.id, si.cache.ShardStats())
		g.Expect(si.cache.ShardStats().OutsideSlots).To(BeNumerically(">=", slotCount/2),
			"%s was sent the other instance's objects: the server ignored the selector", si.id)
	}
}

// TestShardedWatchSlotMoves: a slot moves from one instance selecting by
// shard to another while a reconcile of its object runs. The old holder's
// reconcile is cancelled and returns before its acknowledgement; the slot
// is granted only then (the test plays the sharder); the new holder starts
// a watch of the slot's range and reconciles its object, which still
// carries no slot label; no two instances ever reconciled it at once, and
// the old holder's cache lets go of it.
func TestShardedWatchSlotMoves(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	f := newShardedFixture(t, gatedEnv())
	rec := newRecorder()
	const moved = 2
	started := make(chan struct{}, 1)
	cancelled := make(chan error, 1)
	hook := func(ctx context.Context, req reconcile.Request) {
		if req.Name != fmt.Sprintf("cm-%d", moved) {
			return
		}
		select {
		case started <- struct{}{}:
		default:
		}
		select {
		case <-ctx.Done():
			cancelled <- context.Cause(ctx)
			// Work after the cancellation (cleanup): the acknowledgement,
			// hence the grant, must wait for it, or the runs would overlap.
			time.Sleep(200 * time.Millisecond)
		case <-time.After(time.Minute):
		}
	}
	f.writeTable(g, table(1, map[int]slots.Slot{0: granted("i-0"), 1: granted("i-0"), 2: granted("i-0"), 3: granted("i-0"),
		4: granted("i-1"), 5: granted("i-1"), 6: granted("i-1"), 7: granted("i-1")}))
	first := startShardedInstance(t, f, "i-0", rec, hook)
	second := startShardedInstance(t, f, "i-1", rec, nil)
	g.Eventually(started, 30*time.Second).Should(Receive())
	g.Eventually(runsBy(rec, second, 5), 30*time.Second).Should(BeNumerically(">=", 1))

	// Revision 2 releases the slot from i-0, which cancels its reconcile
	// and acknowledges once it returned.
	f.writeTable(g, table(2, map[int]slots.Slot{0: granted("i-0"), 1: granted("i-0"), 2: releasing("i-0", 2), 3: granted("i-0"),
		4: granted("i-1"), 5: granted("i-1"), 6: granted("i-1"), 7: granted("i-1")}))
	var cause error
	g.Eventually(cancelled, 10*time.Second).Should(Receive(&cause))
	g.Expect(errors.Is(cause, instance.ErrSlotReleased)).To(BeTrue(), "cause %v", cause)
	uid := f.ringUID(g)
	g.Eventually(acknowledgedIn(f.env, f.home, "i-0"), 10*time.Second).Should(Equal(slots.FormatAcknowledgement(uid, 2)))
	g.Expect(runsBy(rec, second, moved)()).To(BeZero(), "not granted yet")

	// Revision 3 grants it to i-1, which watches its range and reconciles
	// its object.
	f.writeTable(g, table(3, map[int]slots.Slot{0: granted("i-0"), 1: granted("i-0"), 2: granted("i-1"), 3: granted("i-0"),
		4: granted("i-1"), 5: granted("i-1"), 6: granted("i-1"), 7: granted("i-1")}))
	g.Eventually(runsBy(rec, second, moved), 20*time.Second).Should(BeNumerically(">=", 1))
	g.Eventually(first.cached(f, moved), 20*time.Second).Should(Satisfy(apierrors.IsNotFound), "the old holder's cache let go of the slot")
	g.Expect(second.requests.seen()).To(ContainElement(slots.ShardSelector([]int{moved}, slotCount).String()))

	// Later changes go to the new holder only.
	before, beforeOld := runsBy(rec, second, moved)(), runsBy(rec, first, moved)()
	f.touch(g, moved)
	g.Eventually(runsBy(rec, second, moved), 10*time.Second).Should(BeNumerically(">", before))
	g.Consistently(runsBy(rec, first, moved), time.Second).Should(Equal(beforeOld))
	g.Expect(rec.overlaps()).To(BeEmpty())
	for _, si := range []*shardedInstance{first, second} {
		g.Expect(si.cache.ShardStats().OutsideSlots).To(BeZero(), si.id)
	}
}

func (f *shardedFixture) ringUID(g Gomega) types.UID {
	r := &v1alpha1.ControllerRing{}
	g.Expect(f.env.Client.Get(context.Background(), client.ObjectKey{Name: f.home}, r)).To(Succeed())
	return r.UID
}

// acknowledgedIn returns the acknowledgement annotation of Lease id in ns.
func acknowledgedIn(e *testenv.Env, ns, id string) func() (string, error) {
	return func() (string, error) {
		l := &coordinationv1.Lease{}
		if err := e.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: id}, l); err != nil {
			return "", err
		}
		return l.Annotations[v1alpha1.AnnotationSlotsAcknowledged], nil
	}
}

// TestShardedWatchNeedsNamespaceKey: selecting by shard on a ring whose
// slots are keyed by object (not ranges of the namespace's hash) is refused
// with ErrShardedListAndWatch, when the manager is created and, for a slot
// cache made without reading the ring, at Setup.
func TestShardedWatchNeedsNamespaceKey(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ns := env().Namespace(t)
	createSlotRing(t, ns) // key Object, the default

	mgrOpts := env().ManagerOptions()
	mgrOpts.NewCache = instance.NewCache(instance.Options{Ring: ns, Identity: "i-0", ShardedListAndWatch: true, Lease: leaseholder.Options{Namespace: ns}}, &corev1.ConfigMap{})
	_, err := manager.New(env().Config, mgrOpts)
	g.Expect(err).To(MatchError(instance.ErrShardedListAndWatch))
	g.Expect(err.Error()).To(ContainSubstring("spec.assignment.slots.key: Namespace"))

	mgrOpts.NewCache = instance.NewShardedSlotCacheFunc(ns, slotCount, &corev1.ConfigMap{})
	_, err = instance.Setup(env().NewManager(t, nil, mgrOpts), instance.Options{Ring: ns, Identity: "i-0", Lease: leaseholder.Options{Namespace: ns}})
	g.Expect(err).To(MatchError(instance.ErrShardedListAndWatch))
}

// TestShardedWatchResources: the main and controlled resources are
// selected by shard when every main resource is namespaced, the main ones
// alone when nothing is controlled, none when a main resource is
// cluster-scoped and others are controlled (a main object would be seen
// before its children, whose slot comes by label); a resource the cache
// holds that is not the ring's keeps the label selector.
func TestShardedWatchResources(t *testing.T) {
	t.Parallel()
	ns := env().Namespace(t)
	secrets := []metav1.GroupResource{{Resource: "secrets"}}
	for _, c := range []struct {
		name      string
		resources []v1alpha1.RingResource
		want      []schema.GroupKind
	}{
		{"namespaced main resources", []v1alpha1.RingResource{{Resource: "configmaps", ControlledResources: secrets}},
			[]schema.GroupKind{{Kind: "ConfigMap"}, {Kind: "Secret"}}},
		{"a cluster-scoped main resource", []v1alpha1.RingResource{{Resource: "configmaps", ControlledResources: secrets},
			{Group: "rbac.authorization.k8s.io", Resource: "clusterroles"}},
			nil},
		{"a cluster-scoped main resource, nothing controlled", []v1alpha1.RingResource{{Resource: "configmaps"},
			{Group: "rbac.authorization.k8s.io", Resource: "clusterroles"}, {Resource: "secrets"}},
			[]schema.GroupKind{{Kind: "ConfigMap"}, {Kind: "Secret"}, {Group: "rbac.authorization.k8s.io", Kind: "ClusterRole"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := NewWithT(t)
			name := fmt.Sprintf("%s-%d", ns, len(c.resources))
			fixture.Create(t, env().Client, fixture.Ring(name, ns, c.resources, func(r *v1alpha1.ControllerRing) {
				r.Spec.Assignment = &v1alpha1.RingAssignment{Unit: v1alpha1.AssignmentUnitSlots,
					Slots: &v1alpha1.RingSlots{Count: slotCount, Key: v1alpha1.SlotKeyNamespace}}
			}))
			mgrOpts := env().ManagerOptions()
			mgrOpts.NewCache = instance.NewCache(instance.Options{Ring: name, Identity: "i-0", ShardedListAndWatch: true, Lease: leaseholder.Options{Namespace: ns}},
				&corev1.ConfigMap{}, &corev1.Secret{}, &rbacv1.ClusterRole{}, &corev1.Pod{})
			mgr, err := manager.New(env().Config, mgrOpts)
			g.Expect(err).NotTo(HaveOccurred())
			sc, ok := mgr.GetCache().(*slotcache.Cache)
			g.Expect(ok).To(BeTrue())
			g.Expect(sc.Sharded()).To(ConsistOf(c.want))
		})
	}
}
