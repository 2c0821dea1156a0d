package slotcache_test

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/sharder-dev/sharder/internal/testenv"
	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/instance/internal/slotcache"
)

var suite testenv.Suite

func env() *testenv.Env { return suite.Env() }

func TestMain(m *testing.M) {
	if os.Getenv("TEST_LOG") != "" {
		ctrl.SetLogger(zap.New(zap.UseDevMode(true)))
	} else {
		ctrl.SetLogger(logr.Discard())
	}
	os.Exit(testenv.Run(m, &suite, testenv.Options{}))
}

const (
	ring  = "widgets"
	count = 256 // 64 groups of 4 slots: slots 0-3 are group 0, 4-7 group 1
)

// createConfigMap creates a ConfigMap in slot (none when slot < 0).
func createConfigMap(t *testing.T, ns, name string, slot int) *corev1.ConfigMap {
	t.Helper()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if slot >= 0 {
		cm.Labels = map[string]string{v1alpha1.SlotLabel(ring): strconv.Itoa(slot)}
	}
	if err := env().Client.Create(context.Background(), cm); err != nil {
		t.Fatal(err)
	}
	return cm
}

// names returns the names of the ConfigMaps the cache lists in ns, sorted.
func names(ctx context.Context, c client.Reader, ns string) ([]string, error) {
	list := &corev1.ConfigMapList{}
	if err := c.List(ctx, list, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	out := make([]string, 0, len(list.Items))
	for _, cm := range list.Items {
		out = append(out, cm.Name)
	}
	slices.Sort(out)
	return out, nil
}

// events records the events a handler receives, by kind and name.
type events struct {
	mu     sync.Mutex
	counts map[string]int // "add/<name>", "update/<name>", "delete/<name>"
}

func newEvents() *events { return &events{counts: map[string]int{}} }

func (e *events) record(kind string, obj any) {
	if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	var name string
	switch o := obj.(type) {
	case *corev1.ConfigMap:
		name = o.Name
	case *metav1.PartialObjectMetadata:
		name = o.Name
	default:
		panic(fmt.Sprintf("event of %T", obj))
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.counts[kind+"/"+name]++
}

func (e *events) OnAdd(obj any, _ bool) { e.record("add", obj) }
func (e *events) OnUpdate(_, obj any)   { e.record("update", obj) }
func (e *events) OnDelete(obj any)      { e.record("delete", obj) }
func (e *events) count(kind, name string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.counts[kind+"/"+name]
}

// deletes returns the names of all Delete events received, sorted.
func (e *events) deletes() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for k, n := range e.counts {
		if name, ok := strings.CutPrefix(k, "delete/"); ok {
			for range n {
				out = append(out, name)
			}
		}
	}
	slices.Sort(out)
	return out
}

// watchVisible lists the cache continuously until the returned function is
// called, and reports through it every list that missed one of want.
func watchVisible(ctx context.Context, c client.Reader, ns string, want []string) (stop func() []string) {
	done := make(chan struct{})
	var missed []string
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			got, err := names(ctx, c, ns)
			if err != nil {
				missed = append(missed, err.Error())
				continue
			}
			for _, name := range want {
				if _, found := slices.BinarySearch(got, name); !found {
					missed = append(missed, name)
				}
			}
		}
	}()
	return func() []string {
		close(done)
		<-finished
		return missed
	}
}

func newCache(t *testing.T, ns string) *slotcache.Cache {
	t.Helper()
	c, err := slotcache.New(env().Config, slotcache.Options{
		Ring:    ring,
		Count:   count,
		Objects: []client.Object{&corev1.ConfigMap{}},
		Cache:   cache.Options{Scheme: env().Scheme, DefaultNamespaces: map[string]cache.Config{ns: {}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// start runs c until the test ends.
func start(t *testing.T, c *slotcache.Cache) context.Context {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("cache: %v", err)
		}
	})
	if !c.WaitForCacheSync(ctx) {
		t.Fatal("cache did not sync")
	}
	return ctx
}

// TestSlotChanges: the cache lists exactly the objects of the slots held;
// adding a slot to a group watched keeps the group's other objects visible
// throughout and tells handlers of the new objects only; dropping a slot or
// a group removes its objects without Delete events; groups come and go
// without more caches running than groups held.
func TestSlotChanges(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	for _, slot := range []int{0, 1, 2, 5, 9} {
		for _, suffix := range []string{"a", "b"} {
			createConfigMap(t, ns, fmt.Sprintf("s%d-%s", slot, suffix), slot)
		}
	}
	createConfigMap(t, ns, "unlabelled", -1)

	c := newCache(t, ns)
	g.Expect(c.SetSlots(context.Background(), []int{count})).NotTo(Succeed())
	g.Expect(c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "s0-a"}, &corev1.ConfigMap{})).
		To(MatchError(&cache.ErrCacheNotStarted{}))
	g.Expect(c.SetSlots(context.Background(), []int{1, 0})).To(Succeed())
	ctx := start(t, c)
	g.Expect(c.Groups()).To(Equal([]int{0}))
	g.Expect(c.RunningCaches()).To(Equal(1))
	g.Expect(names(ctx, c, ns)).To(Equal([]string{"s0-a", "s0-b", "s1-a", "s1-b"}))

	inf, err := c.GetInformer(ctx, &corev1.ConfigMap{})
	g.Expect(err).NotTo(HaveOccurred())
	ev := newEvents()
	reg, err := inf.AddEventHandler(ev)
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(reg.HasSynced).Should(BeTrue())
	for _, name := range []string{"s0-a", "s0-b", "s1-a", "s1-b"} {
		g.Expect(ev.count("add", name)).To(Equal(1), name)
	}

	// Slot 2 joins group 0: its old cache serves until the new one synced.
	stop := watchVisible(ctx, c, ns, []string{"s0-a", "s0-b", "s1-a", "s1-b"})
	g.Expect(c.SetSlots(ctx, []int{0, 1, 2})).To(Succeed())
	g.Expect(names(ctx, c, ns)).To(Equal([]string{"s0-a", "s0-b", "s1-a", "s1-b", "s2-a", "s2-b"}))
	g.Expect(stop()).To(BeEmpty(), "lists missing objects of slots held throughout")
	g.Expect(c.Groups()).To(Equal([]int{0}))
	g.Expect(c.RunningCaches()).To(Equal(1))
	g.Eventually(func() int { return ev.count("add", "s2-a") + ev.count("add", "s2-b") }).Should(Equal(2))
	for _, name := range []string{"s0-a", "s0-b", "s1-a", "s1-b"} {
		g.Expect(ev.count("add", name)).To(Equal(1), "objects already known are not added again: %s", name)
		g.Expect(ev.count("update", name)).To(BeZero(), name)
	}
	g.Expect(ev.deletes()).To(BeEmpty())

	// Events keep coming from the group's new cache, once each.
	createConfigMap(t, ns, "s2-c", 2)
	g.Eventually(func() int { return ev.count("add", "s2-c") }).Should(Equal(1))
	updated := &corev1.ConfigMap{}
	g.Expect(env().Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "s0-a"}, updated)).To(Succeed())
	updated.Data = map[string]string{"k": "v"}
	g.Expect(env().Client.Update(ctx, updated)).To(Succeed())
	g.Eventually(func() int { return ev.count("update", "s0-a") }).Should(Equal(1))
	g.Expect(names(ctx, c, ns)).To(ContainElement("s2-c"))

	// A new group.
	g.Expect(c.SetSlots(ctx, []int{0, 1, 2, 5})).To(Succeed())
	g.Expect(c.Groups()).To(Equal([]int{0, 1}))
	g.Expect(c.RunningCaches()).To(Equal(2))
	g.Expect(names(ctx, c, ns)).To(Equal([]string{"s0-a", "s0-b", "s1-a", "s1-b", "s2-a", "s2-b", "s2-c", "s5-a", "s5-b"}))
	g.Eventually(func() int { return ev.count("add", "s5-a") + ev.count("add", "s5-b") }).Should(Equal(2))

	// Slot 1 dropped: its objects leave the view, without Delete events.
	stop = watchVisible(ctx, c, ns, []string{"s0-a", "s0-b", "s2-a", "s2-b", "s2-c", "s5-a", "s5-b"})
	g.Expect(c.SetSlots(ctx, []int{0, 2, 5})).To(Succeed())
	g.Expect(stop()).To(BeEmpty())
	g.Expect(names(ctx, c, ns)).To(Equal([]string{"s0-a", "s0-b", "s2-a", "s2-b", "s2-c", "s5-a", "s5-b"}))
	g.Expect(c.RunningCaches()).To(Equal(2))
	g.Expect(ev.deletes()).To(BeEmpty())

	// Get tries the groups.
	cm := &corev1.ConfigMap{}
	g.Expect(c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "s5-a"}, cm)).To(Succeed())
	g.Expect(cm.Labels).To(HaveKeyWithValue(v1alpha1.SlotLabel(ring), "5"))
	for _, name := range []string{"s1-a", "s9-a", "unlabelled"} {
		err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &corev1.ConfigMap{})
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "%s: %v", name, err)
	}
	// List honours label selectors.
	list := &corev1.ConfigMapList{}
	g.Expect(c.List(ctx, list, client.InNamespace(ns), client.MatchingLabels{v1alpha1.SlotLabel(ring): "2"})).To(Succeed())
	g.Expect(list.Items).To(HaveLen(3))

	// A real deletion is told once.
	g.Expect(env().Client.Delete(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "s5-a"}})).To(Succeed())
	g.Eventually(ev.deletes).Should(Equal([]string{"s5-a"}))

	// Group 0 dropped entirely.
	g.Expect(c.SetSlots(ctx, []int{5})).To(Succeed())
	g.Expect(c.Groups()).To(Equal([]int{1}))
	g.Expect(c.RunningCaches()).To(Equal(1))
	g.Expect(names(ctx, c, ns)).To(Equal([]string{"s5-b"}))
	g.Expect(ev.deletes()).To(Equal([]string{"s5-a"}))

	// Slot 1 back: its objects are added again.
	g.Expect(c.SetSlots(ctx, []int{1, 5})).To(Succeed())
	g.Expect(names(ctx, c, ns)).To(Equal([]string{"s1-a", "s1-b", "s5-b"}))
	g.Eventually(func() int { return ev.count("add", "s1-a") }).Should(Equal(2))

	// Kinds not of the ring come from the plain cache, unselected.
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "plain"}}
	g.Expect(env().Client.Create(ctx, secret)).To(Succeed())
	g.Eventually(func() error {
		return c.Get(ctx, client.ObjectKeyFromObject(secret), &corev1.Secret{})
	}).Should(Succeed())

	g.Expect(c.SetSlots(ctx, nil)).To(Succeed())
	g.Expect(c.Groups()).To(BeEmpty())
	g.Expect(c.RunningCaches()).To(BeZero())
	g.Expect(names(ctx, c, ns)).To(BeEmpty())
	g.Expect(ev.deletes()).To(Equal([]string{"s5-a"}))
}

// TestRetell: Retell tells every handler an Add of each object of the
// slots asked for that the cache serves, objects it was told of already,
// and nothing of other slots or of slots not served; the handler's events
// go on as before (a later change is one Update).
func TestRetell(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	for _, slot := range []int{0, 1, 5, 9} {
		createConfigMap(t, ns, fmt.Sprintf("s%d", slot), slot)
	}
	c := newCache(t, ns)
	g.Expect(c.Retell(context.Background(), []int{0})).To(Succeed(), "nothing to tell before Start")
	g.Expect(c.SetSlots(context.Background(), []int{5, 0, 1})).To(Succeed())
	ctx := start(t, c)
	g.Expect(c.Slots()).To(Equal([]int{0, 1, 5}))

	inf, err := c.GetInformer(ctx, &corev1.ConfigMap{})
	g.Expect(err).NotTo(HaveOccurred())
	ev := newEvents()
	reg, err := inf.AddEventHandler(ev)
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(reg.HasSynced).Should(BeTrue())
	for _, name := range []string{"s0", "s1", "s5"} {
		g.Eventually(func() int { return ev.count("add", name) }).Should(Equal(1), name)
	}

	g.Expect(c.Retell(ctx, []int{9, 5, 1})).To(Succeed())
	g.Expect(ev.count("add", "s1")).To(Equal(2))
	g.Expect(ev.count("add", "s5")).To(Equal(2))
	g.Expect(ev.count("add", "s0")).To(Equal(1), "a slot not asked for")
	g.Expect(ev.count("add", "s9")).To(BeZero(), "a slot not served")
	g.Expect(ev.deletes()).To(BeEmpty())

	updated := &corev1.ConfigMap{}
	g.Expect(env().Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "s1"}, updated)).To(Succeed())
	updated.Data = map[string]string{"k": "v"}
	g.Expect(env().Client.Update(ctx, updated)).To(Succeed())
	g.Eventually(func() int { return ev.count("update", "s1") }).Should(Equal(1))
	g.Consistently(func() int { return ev.count("add", "s1") }, 300*time.Millisecond).Should(Equal(2))
}

// TestControllerAcrossGroupChanges: a controller-runtime controller on a
// manager whose cache is the slot cache reconciles the objects of its
// slots, keeps receiving events for objects created after its groups
// changed, and reads them through the manager's client.
func TestControllerAcrossGroupChanges(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	opts := env().ManagerOptions()
	opts.Cache = cache.Options{DefaultNamespaces: map[string]cache.Config{ns: {}}}
	opts.NewCache = func(cfg *rest.Config, o cache.Options) (cache.Cache, error) {
		return slotcache.New(cfg, slotcache.Options{Ring: ring, Count: count, Objects: []client.Object{&corev1.ConfigMap{}}, Cache: o})
	}
	mgr := env().NewManager(t, nil, opts)
	sc, ok := mgr.GetCache().(*slotcache.Cache)
	g.Expect(ok).To(BeTrue())
	g.Expect(sc.SetSlots(context.Background(), []int{3})).To(Succeed())

	var mu sync.Mutex
	reconciled := map[string]int{}
	notFound := map[string]int{}
	reconciledOf := func(name string) func() int {
		return func() int {
			mu.Lock()
			defer mu.Unlock()
			return reconciled[name]
		}
	}
	err := ctrl.NewControllerManagedBy(mgr).
		Named("slotcache-test").
		For(&corev1.ConfigMap{}).
		Complete(reconcile.Func(func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
			err := mgr.GetClient().Get(ctx, req.NamespacedName, &corev1.ConfigMap{})
			mu.Lock()
			defer mu.Unlock()
			if apierrors.IsNotFound(err) {
				notFound[req.Name]++
				return reconcile.Result{}, nil
			}
			reconciled[req.Name]++
			return reconcile.Result{}, err
		}))
	g.Expect(err).NotTo(HaveOccurred())
	testenv.StartManager(t, mgr)
	ctx := context.Background()

	createConfigMap(t, ns, "a3", 3)
	createConfigMap(t, ns, "x9", 9)
	createConfigMap(t, ns, "unlabelled", -1)
	g.Eventually(reconciledOf("a3"), 10*time.Second).Should(BeNumerically(">=", 1))

	// Group 0 changes (slot 2 joins), group 1 is new (slot 7).
	g.Expect(sc.SetSlots(ctx, []int{2, 3, 7})).To(Succeed())
	g.Expect(sc.RunningCaches()).To(Equal(2))
	for name, slot := range map[string]int{"b2": 2, "c7": 7, "d3": 3} {
		createConfigMap(t, ns, name, slot)
	}
	for _, name := range []string{"b2", "c7", "d3"} {
		g.Eventually(reconciledOf(name), 10*time.Second).Should(BeNumerically(">=", 1), name)
	}

	// Slot 3 dropped: events of the others keep coming.
	g.Expect(sc.SetSlots(ctx, []int{2, 7})).To(Succeed())
	createConfigMap(t, ns, "e2", 2)
	g.Eventually(reconciledOf("e2"), 10*time.Second).Should(BeNumerically(">=", 1))

	mu.Lock()
	defer mu.Unlock()
	g.Expect(reconciled).NotTo(HaveKey("x9"))
	g.Expect(reconciled).NotTo(HaveKey("unlabelled"))
	g.Expect(notFound).To(BeEmpty(), "no event made the controller read an object the cache does not hold")
}

// view is what a handler was told: each object's resourceVersion and slot.
type view struct {
	mu      sync.Mutex
	objects map[string][2]string // name to resourceVersion and slot
	deleted map[string]bool      // names told deleted, ever
}

func newView() *view { return &view{objects: map[string][2]string{}, deleted: map[string]bool{}} }

func (v *view) set(obj any) {
	cm := obj.(*corev1.ConfigMap)
	v.mu.Lock()
	defer v.mu.Unlock()
	v.objects[cm.Name] = [2]string{cm.ResourceVersion, cm.Labels[v1alpha1.SlotLabel(ring)]}
}

func (v *view) OnAdd(obj any, _ bool) { v.set(obj) }
func (v *view) OnUpdate(_, obj any)   { v.set(obj) }
func (v *view) OnDelete(obj any) {
	if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	cm := obj.(*corev1.ConfigMap)
	v.mu.Lock()
	defer v.mu.Unlock()
	delete(v.objects, cm.Name)
	v.deleted[cm.Name] = true
}

// of returns the objects of slots the handler was told of, name to
// resourceVersion, and the names it was ever told deleted.
func (v *view) of(slots ...int) (map[string]string, map[string]bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := map[string]string{}
	for name, o := range v.objects {
		for _, s := range slots {
			if o[1] == strconv.Itoa(s) {
				out[name] = o[0]
			}
		}
	}
	return out, maps.Clone(v.deleted)
}

// TestHandlerFollowsTheCacheThroughSwitches: while objects are created,
// updated and deleted in the slots of two groups, the groups change again
// and again; a handler's view of the slots held since they were added
// (what it was told) ends equal to the cache's contents, and it is told of
// no deletion that did not happen. (Objects of a slot dropped leave its
// view untold, by design: they are not compared.)
func TestHandlerFollowsTheCacheThroughSwitches(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	c := newCache(t, ns)
	g.Expect(c.SetSlots(context.Background(), []int{0})).To(Succeed())
	ctx := start(t, c)
	inf, err := c.GetInformer(ctx, &corev1.ConfigMap{})
	g.Expect(err).NotTo(HaveOccurred())
	v := newView()
	_, err = inf.AddEventHandler(v)
	g.Expect(err).NotTo(HaveOccurred())

	// The writer: creates objects in slots 0, 1, 2, 5 and 6 in turn,
	// updates the one created two steps before, and deletes the one
	// created four before every third step.
	var deletedMu sync.Mutex
	deleted := map[string]bool{}
	stop := make(chan struct{})
	written := make(chan error, 1)
	go func() {
		name := func(i int) string { return fmt.Sprintf("w%d", i) }
		for i := 0; ; i++ {
			select {
			case <-stop:
				written <- nil
				return
			default:
			}
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name(i),
				Labels: map[string]string{v1alpha1.SlotLabel(ring): strconv.Itoa([]int{0, 1, 2, 5, 6}[i%5])}}}
			if err := env().Client.Create(ctx, cm); err != nil {
				written <- err
				return
			}
			if i >= 2 {
				up := &corev1.ConfigMap{}
				if err := env().Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name(i - 2)}, up); err == nil {
					up.Data = map[string]string{"i": strconv.Itoa(i)}
					if err := env().Client.Update(ctx, up); err != nil {
						written <- err
						return
					}
				}
			}
			if i >= 4 && i%3 == 0 {
				deletedMu.Lock()
				deleted[name(i-4)] = true
				deletedMu.Unlock()
				if err := env().Client.Delete(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name(i - 4)}}); err != nil && !apierrors.IsNotFound(err) {
					written <- err
					return
				}
			}
		}
	}()
	// Slots 2, 5 and 6 are never dropped once added.
	for _, held := range [][]int{{0, 1}, {0, 1, 2}, {0, 1, 2, 5}, {0, 2, 5}, {2, 5}, {2, 5, 6}} {
		g.Expect(c.SetSlots(ctx, held)).To(Succeed())
		g.Expect(c.RunningCaches()).To(Equal(len(c.Groups())))
	}
	close(stop)
	g.Expect(<-written).To(Succeed())

	contents := func() (map[string]string, error) {
		list := &corev1.ConfigMapList{}
		if err := c.List(ctx, list, client.InNamespace(ns)); err != nil {
			return nil, err
		}
		out := map[string]string{}
		for _, cm := range list.Items {
			out[cm.Name] = cm.ResourceVersion
		}
		return out, nil
	}
	g.Eventually(func(g Gomega) {
		want, err := contents()
		g.Expect(err).NotTo(HaveOccurred())
		got, _ := v.of(2, 5, 6)
		g.Expect(got).To(Equal(want))
	}).Should(Succeed())
	_, told := v.of()
	deletedMu.Lock()
	defer deletedMu.Unlock()
	for name := range told {
		g.Expect(deleted).To(HaveKey(name), "told deleted but was not: %s", name)
	}
}
