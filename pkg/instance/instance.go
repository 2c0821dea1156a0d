package instance

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/instance/internal/inflight"
	"github.com/sharder-dev/sharder/pkg/instance/leaseholder"
	"github.com/sharder-dev/sharder/pkg/instance/slotcache"
	"github.com/sharder-dev/sharder/pkg/slots"
)

// RBAC: the instance runs inside the user's controller, whose role this
// package cannot generate (a +kubebuilder:rbac marker here would land in the
// sharder's own role). The controller's service account needs get, list,
// watch, create and update on Leases in the ring's lease namespace, and patch on the ring's
// main resources for drain acknowledgements (docs/instance.md); in slot mode,
// get, list and watch on its ControllerRing instead of the patch.

// ErrMoved is the cause (context.Cause) of the cancellation of a reconcile
// whose object was assigned away from this instance while it ran.
var ErrMoved = errors.New("the object was assigned to another instance")

// ErrLeaseLost is the cause (context.Cause) of the cancellation of the
// reconciles running when the instance lost its Lease.
var ErrLeaseLost = leaseholder.ErrLeaseLost

// ErrStaleWatch is the cause of the contexts of reconciles cancelled because
// the instance's watch fell further behind than Options.MaxWatchLag.
var ErrStaleWatch = errors.New("the instance's watch fell behind the API server")

// ErrShutdownOverdue is the cause of the cancellation of the reconciles still
// running when the instance's shutdown timeout ended: the Lease is left to
// expire, and they must return within Options.StopTimeout.
var ErrShutdownOverdue = errors.New("the instance's shutdown timeout ended with reconciles in flight")

// moveCheckTimeout bounds the read that tells a moved object from a deleted
// one when it leaves the cache while a reconcile of it runs.
const moveCheckTimeout = 10 * time.Second

// Instance is one instance of a ring on a controller-runtime manager: it holds
// the instance's Lease, admits reconciles only while it holds it, tracks the
// reconciles in flight, acknowledges drains and reports gained and lost
// objects. Create it with Setup.
type Instance struct {
	opts       Options
	client     client.Client // the manager's client: reads from its cache
	apiReader  client.Reader // reads from the API server
	cache      cache.Cache
	mgr        manager.Manager
	log        logr.Logger
	reconciles *inflight.Gate
	holder     *leaseholder.Holder
	// slots is the instance's state in slot mode, nil in object mode.
	slots *slotMode

	// acked holds the objects whose drain this instance is acknowledging or
	// has acknowledged, until they leave the cache.
	acked sync.Map // inflight.Key -> struct{}
	// handedOver remembers the objects this instance acknowledged recently:
	// when one leaves the cache, its request needs no read from the API
	// server to tell a move from a deletion.
	handedOver handOvers

	mu        sync.Mutex
	kinds     map[schema.GroupVersionKind]client.Object
	notifiers []Notifier
	startCtx  context.Context // set once started
}

var (
	_ manager.Runnable               = &Instance{}
	_ manager.LeaderElectionRunnable = &Instance{}
)

// Setup makes the manager's process an instance of opts.Ring: it adds the
// instance's Lease holder and the instance itself to mgr, and a readiness
// check "instance-<ring>" that passes once the Lease is held.
//
// When the instance loses its Lease it stops reconciling at once, and the
// manager stops: mgr.Start returns an error wrapping ErrLeaseLost, as it
// returns one on lost leader election. Exit non-zero then, so that the
// process is restarted (its pod's container) and the instance rejoins.
//
// The manager's cache must already select the instance's objects (see
// CacheByObject with the same ring and identity): cache selectors are fixed
// when the manager is created. Wrap each reconciler of the ring's main
// resources with the returned Instance.
//
// When the manager's cache is a slot cache (SlotCache, or
// slotcache.NewCacheFunc) of opts.Ring, the instance runs in slot mode (see
// the package documentation): it admits reconciles by its record of the
// slots it holds, read from the ring after it acquired its Lease. Setup
// reads the ring, when it can, and returns an error wrapping ErrModeMismatch
// when the cache does not fit it (a ring of unit Slots with another cache,
// a slot cache for a ring of unit Objects or another slot count, or a slot
// cache of another ring), and an error wrapping ErrShardedListAndWatch when
// the slot cache selects by shard (SlotOptions.ShardedListAndWatch) on a ring
// whose slots are not keyed by namespace. An instance in slot mode checks
// the ring again when it starts: the manager then stops with such an error.
//
// The instance runs on every replica (NeedLeaderElection is false); run the
// manager without leader election, since each instance reconciles only its
// own objects.
//
// Setup fills in the defaults of opts and returns an error naming the
// option when one breaks its rule (Options states them), before anything is
// added to mgr.
func Setup(mgr manager.Manager, opts Options) (*Instance, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	if err := opts.validate(); err != nil {
		return nil, err
	}
	// The Lease is read and written directly, and watched by name: the
	// manager's cache must not start watching every Lease in the cluster for
	// this.
	direct, err := client.NewWithWatch(mgr.GetConfig(), client.Options{
		HTTPClient: mgr.GetHTTPClient(),
		Scheme:     mgr.GetScheme(),
		Mapper:     mgr.GetRESTMapper(),
	})
	if err != nil {
		return nil, fmt.Errorf("creating the Lease client: %w", err)
	}
	i := &Instance{
		opts:       opts,
		client:     mgr.GetClient(),
		apiReader:  mgr.GetAPIReader(),
		cache:      mgr.GetCache(),
		mgr:        mgr,
		log:        mgr.GetLogger().WithName("instance").WithValues("ring", opts.Ring, "instance", opts.Identity),
		reconciles: inflight.New(),
		kinds:      map[schema.GroupVersionKind]client.Object{},
	}
	// Slot mode is the manager's cache's choice: a slot cache of the ring.
	sc, _ := mgr.GetCache().(*slotcache.Cache)
	if sc != nil && sc.Ring() != opts.Ring {
		return nil, fmt.Errorf("%w: the manager's slot cache is of ring %q, the instance of ring %q", ErrModeMismatch, sc.Ring(), opts.Ring)
	}
	ringClient, err := newRingClient(mgr.GetConfig(), mgr.GetHTTPClient())
	if err != nil {
		return nil, err
	}
	if err := i.checkRingAtSetup(ringClient, sc); err != nil {
		return nil, err
	}
	if sc != nil {
		i.slots = newSlotMode(i, sc, ringClient)
	}
	i.holder, err = leaseholder.NewHolder(direct, leaseholder.HolderOptions{
		Ring:            opts.Ring,
		Namespace:       opts.LeaseNamespace,
		Identity:        opts.Identity,
		VirtualNodes:    opts.VirtualNodes,
		LeaseDuration:   opts.LeaseDuration,
		RenewPeriod:     opts.RenewPeriod,
		RenewDeadline:   opts.RenewDeadline,
		Pod:             opts.Pod,
		OnLost:          i.lost,
		Release:         opts.Release,
		BeforeRelease:   i.beforeRelease,
		MaxWatchLag:     max(opts.MaxWatchLag, 0),
		MaxStop:         opts.StopTimeout,
		Clock:           opts.Clock,
		ShutdownTimeout: opts.ShutdownTimeout,
	})
	if err != nil {
		return nil, err // names the lease holder
	}
	if err := mgr.Add(i.holder); err != nil {
		return nil, fmt.Errorf("adding the Lease holder: %w", err)
	}
	if err := mgr.Add(i); err != nil {
		return nil, fmt.Errorf("adding the instance: %w", err)
	}
	if err := mgr.AddReadyzCheck("instance-"+opts.Ring, i.readyz); err != nil {
		return nil, fmt.Errorf("adding the readiness check: %w", err)
	}
	return i, nil
}

// Ring returns the ring's name.
func (i *Instance) Ring() string { return i.opts.Ring }

// Identity returns the instance ID.
func (i *Instance) Identity() string { return i.opts.Identity }

// AddNotifier registers n for the objects of every kind passed to Wrap. Add
// notifiers before the manager starts, or they miss the objects already
// reported as gained.
func (i *Instance) AddNotifier(n Notifier) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.notifiers = append(i.notifiers, n)
}

// LabelChild gives child its owner's shard label of the instance's ring (in
// slot mode: its owner's slot label), so that a child created during a
// reconcile of owner is assigned with its owner from the start: the
// instance's own label-selected cache sees it at once, and the sharder and
// the webhook find it where they would put it (in slot mode the sharder
// need not write it at all). Call it before creating child (next to setting
// its controller reference). It reports false, leaving child alone, when
// owner carries neither label. In slot mode with
// SlotOptions.ShardedListAndWatch, an owner of a kind selected by shard that
// is not labelled yet (the instance saw it before the sharder labelled it)
// gives child the slot of its namespace, the slot the sharder will write on
// both.
func (i *Instance) LabelChild(owner, child metav1.Object) bool {
	copied := LabelChild(i.opts.Ring, owner, child)
	if i.slots == nil || hasLabel(owner, v1alpha1.SlotLabel(i.opts.Ring)) {
		return copied
	}
	ro, ok := owner.(runtime.Object)
	if !ok {
		return copied
	}
	gvk, err := apiutil.GVKForObject(ro, i.mgr.GetScheme())
	if err != nil {
		return copied
	}
	slot, ok := i.slots.slotOf(gvk.GroupKind(), owner)
	if !ok {
		return copied
	}
	labels := child.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels[v1alpha1.SlotLabel(i.opts.Ring)] = strconv.Itoa(slot)
	child.SetLabels(labels)
	return true
}

func hasLabel(obj metav1.Object, key string) bool {
	_, ok := obj.GetLabels()[key]
	return ok
}

// LabelChild is Instance.LabelChild for a given ring: it copies whichever of
// the ring's shard label (object mode) and slot label (slot mode) owner
// carries.
func LabelChild(ring string, owner, child metav1.Object) bool {
	copied := false
	for _, key := range []string{v1alpha1.ShardLabel(ring), v1alpha1.SlotLabel(ring)} {
		value, ok := owner.GetLabels()[key]
		if !ok || value == "" {
			continue
		}
		labels := child.GetLabels()
		if labels == nil {
			labels = map[string]string{}
		}
		labels[key] = value
		child.SetLabels(labels)
		copied = true
	}
	return copied
}

// SlotRecord returns, in slot mode, a copy of the instance's record of the
// slots it holds (the revision of the last slot table it acted on and its
// slots); ok is false in object mode.
func (i *Instance) SlotRecord() (record slots.Record, ok bool) {
	if i.slots == nil {
		return slots.Record{}, false
	}
	return i.slots.Record(), true
}

// NeedLeaderElection returns false: every instance runs.
func (i *Instance) NeedLeaderElection() bool { return false }

// Start registers the notifications with the cache, waits until the instance
// holds its Lease, then admits reconciles until ctx ends. In slot mode it
// first reads the ring and applies its table, then follows the ring; it
// returns an error when the ring does not fit the manager's cache
// (ErrModeMismatch) or was deleted and created again.
func (i *Instance) Start(ctx context.Context) error {
	i.mu.Lock()
	i.startCtx = ctx
	kinds := make([]client.Object, 0, len(i.kinds))
	for _, proto := range i.kinds {
		kinds = append(kinds, proto)
	}
	i.mu.Unlock()
	for _, proto := range kinds {
		if err := i.watch(ctx, proto); err != nil {
			return err
		}
	}

	// The holder acquires the Lease; reconciles wait until it did.
	err := wait.PollUntilContextCancel(ctx, i.opts.RetryPeriod/4, true, func(context.Context) (bool, error) {
		return i.holder.Held(), nil
	})
	if err != nil {
		return nil //nolint:nilerr // ctx ended before the Lease was held: a normal shutdown
	}
	if i.slots != nil {
		go i.checkWatchLag(ctx)
		return i.slots.start(ctx, func() {
			i.reconciles.Open()
			i.log.Info("Instance holds its Lease and read its slots, reconciling", "slots", slots.FormatList(i.slots.Record().Slots),
				"selectedByShard", i.slots.cache.Sharded())
		})
	}
	i.reconciles.Open()
	i.log.Info("Instance holds its Lease, reconciling")
	i.checkWatchLag(ctx)
	<-ctx.Done()
	return nil
}

// checksWatchLag reports whether the instance keeps its promise on the lag
// of its watches (Options.MaxWatchLag).
func (i *Instance) checksWatchLag() bool {
	return i.opts.MaxWatchLag > 0 && i.holder.Watching()
}

// watchCurrent reports whether the instance's watch is proven no further
// behind than Options.MaxWatchLag (always true when it makes no promise).
func (i *Instance) watchCurrent() bool {
	return !i.checksWatchLag() || i.opts.Clock.Since(i.holder.WatchedAt()) <= i.opts.MaxWatchLag
}

// checkWatchLag cancels the reconciles in flight whenever the watch falls
// further behind than Options.MaxWatchLag, until ctx ends. New reconciles
// ask watchCurrent themselves; this catches those that started before. It
// looks every eighth of the lag (at most every 250ms), which the sharder's
// force grace covers.
func (i *Instance) checkWatchLag(ctx context.Context) {
	if !i.checksWatchLag() {
		return
	}
	every := min(max(i.opts.MaxWatchLag/8, 10*time.Millisecond), 250*time.Millisecond)
	behind := false
	for {
		switch current := i.watchCurrent(); {
		case !current && !behind:
			behind = true
			i.bound(ErrStaleWatch, i.reconciles.CancelAll(ErrStaleWatch))
			i.log.Info("The instance's watch fell behind: no reconciles until it catches up",
				"lastRenewalSeen", i.holder.WatchedAt(), "maxWatchLag", i.opts.MaxWatchLag)
		case current && behind:
			behind = false
			i.log.Info("The instance's watch caught up: reconciling again")
		}
		t := i.opts.Clock.NewTimer(every)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
	}
}

func (i *Instance) readyz(_ *http.Request) error {
	if i.reconciles.Admitting() {
		return nil
	}
	return errors.New("the instance does not hold its Lease")
}

// watch registers the notification handler for proto's kind.
func (i *Instance) watch(ctx context.Context, proto client.Object) error {
	gvk, err := apiutil.GVKForObject(proto, i.mgr.GetScheme())
	if err != nil {
		return fmt.Errorf("finding the kind of %T: %w", proto, err)
	}
	informer, err := i.cache.GetInformer(ctx, proto)
	if err != nil {
		return fmt.Errorf("getting the informer for %s: %w", gvk.Kind, err)
	}
	if _, err := informer.AddEventHandler(eventHandler{inst: i, gvk: gvk}); err != nil {
		return fmt.Errorf("adding the notification handler for %s: %w", gvk.Kind, err)
	}
	return nil
}

// register remembers proto's kind for notifications.
func (i *Instance) register(gvk schema.GroupVersionKind, proto client.Object) {
	i.mu.Lock()
	if _, ok := i.kinds[gvk]; ok {
		i.mu.Unlock()
		return
	}
	i.kinds[gvk] = proto
	ctx := i.startCtx
	i.mu.Unlock()
	if ctx != nil { // wrapped after the start: watch now
		if err := i.watch(ctx, proto); err != nil {
			i.log.Error(err, "Notifications unavailable", "kind", gvk.Kind)
		}
	}
}

// assigned reports whether obj, of kind gk, carries this instance's shard
// label (in slot mode: has a slot of the record, slotMode.slotOf).
func (i *Instance) assigned(gk schema.GroupKind, obj metav1.Object) bool {
	if i.slots != nil {
		slot, ok := i.slots.slotOf(gk, obj)
		return ok && i.slots.holds(slot)
	}
	return obj.GetLabels()[v1alpha1.ShardLabel(i.opts.Ring)] == i.opts.Identity
}

func (i *Instance) shardLabel() string { return v1alpha1.ShardLabel(i.opts.Ring) }

// notify calls every notifier.
func (i *Instance) notify(call func(Notifier)) {
	i.mu.Lock()
	notifiers := slices.Clone(i.notifiers)
	i.mu.Unlock()
	for _, n := range notifiers {
		call(n)
	}
}

// left reports that obj is no longer this instance's: assigned elsewhere
// (moved), or gone from the instance's label-selected cache, moved or
// deleted.
func (i *Instance) left(gvk schema.GroupVersionKind, obj client.Object, moved bool) {
	key := inflight.Key{GroupKind: gvk.GroupKind(), NamespacedName: client.ObjectKeyFromObject(obj)}
	if i.slots != nil {
		// No drain in slot mode: the object was deleted, or its slot label
		// was changed past the slot label policy (not bound yet, or
		// bypassed), which moves it to the holder of its new slot.
		i.cancelMoved(gvk, key, moved)
		i.notify(func(n Notifier) { n.OnLost(obj) })
		return
	}
	if _, drained := i.acked.LoadAndDelete(key); drained {
		i.notify(func(n Notifier) { n.OnDrained(obj) })
		return
	}
	i.cancelMoved(gvk, key, moved)
	i.notify(func(n Notifier) { n.OnLost(obj) })
}

// cancelMoved cancels the reconciles in flight of an object that left
// without this instance's acknowledgement, once it is known to be assigned
// elsewhere: at once when the cache saw the new label (moved), else after a
// read from the API server, since a label-selected cache shows a move and a
// deletion alike. Reconciles of a deleted object run on: they may be
// finishing its deletion.
func (i *Instance) cancelMoved(gvk schema.GroupVersionKind, key inflight.Key, moved bool) {
	if i.reconciles.RunningOf(key) == 0 {
		return
	}
	cancel := func() {
		if cancelled := i.reconciles.Cancel(key, ErrMoved); len(cancelled) > 0 {
			i.log.Info("Cancelled reconciles of an object assigned elsewhere", "kind", gvk.Kind, "object", klog.KRef(key.Namespace, key.Name), "reconciles", len(cancelled))
			i.bound(ErrMoved, cancelled)
		}
	}
	if moved {
		cancel()
		return
	}
	go func() {
		ctx, stop := context.WithTimeout(context.Background(), moveCheckTimeout)
		defer stop()
		live := &metav1.PartialObjectMetadata{}
		live.SetGroupVersionKind(gvk)
		if err := i.apiReader.Get(ctx, key.NamespacedName, live); err != nil {
			if !apierrors.IsNotFound(err) {
				i.log.Error(err, "Could not tell whether an object left by a move; its reconciles in flight run on", "kind", gvk.Kind, "object", klog.KRef(key.Namespace, key.Name))
			}
			return
		}
		if !i.assigned(gvk.GroupKind(), live) {
			cancel()
		}
	}()
}

// lost is the Lease holder's OnLost: stop at once (no new reconcile, those
// in flight cancelled), then the user's answer.
func (i *Instance) lost() {
	i.reconciles.Close()
	i.bound(ErrLeaseLost, i.reconciles.CancelAll(ErrLeaseLost))
	if i.slots != nil {
		i.slots.drop()
	}
	i.log.Info("Instance lost its Lease, no longer reconciling")
	if i.opts.OnLost != nil {
		i.opts.OnLost()
	}
}

// beforeRelease is the Lease holder's BeforeRelease: admit no new reconcile
// and wait for those in flight, so that no other instance starts on an
// object this one is still working on.
func (i *Instance) beforeRelease(ctx context.Context) error {
	i.reconciles.Close()
	running := i.reconciles.Running()
	if running > 0 {
		i.log.Info("Waiting for reconciles in flight before releasing the Lease", "running", running)
	}
	if err := i.reconciles.Wait(ctx); err != nil {
		// The Lease is left to expire: from now on the holder does not
		// renew it, so the reconciles still running must stop as on a
		// lost Lease (their contexts ended with the manager's).
		i.bound(ErrShutdownOverdue, i.reconciles.CancelAll(ErrShutdownOverdue))
		return fmt.Errorf("%d reconciles still in flight: %w", i.reconciles.Running(), err)
	}
	return nil
}

// bound holds the instance to its bound on stopping (Options.StopTimeout)
// for the reconciles it just cancelled, with cause, because it may no longer
// act: when any of them is still running StopTimeout later, it calls
// Options.OnStopOverdue, whose default ends the process.
func (i *Instance) bound(cause error, cancelled inflight.Cancelled) {
	if len(cancelled) == 0 {
		return
	}
	t := i.opts.Clock.NewTimer(i.opts.StopTimeout)
	go func() {
		defer t.Stop()
		if cancelled.Wait(t.C()) {
			return
		}
		running := cancelled.Running()
		if running == 0 {
			return
		}
		i.log.Error(cause, "Reconciles cancelled because the instance may no longer act did not return within its stop timeout: ending the process, as promised on the Lease",
			"running", running, "stopTimeout", i.opts.StopTimeout)
		if i.opts.OnStopOverdue != nil {
			i.opts.OnStopOverdue(running)
			return
		}
		os.Exit(1)
	}()
}
