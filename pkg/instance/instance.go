package instance

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/instance/internal/inflight"
	"github.com/sharder-dev/sharder/pkg/instance/internal/slotcache"
	"github.com/sharder-dev/sharder/pkg/instance/leaseholder"
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
// the instance's watch fell further behind than Options.Lease.MaxWatchLag.
var ErrStaleWatch = errors.New("the instance's watch fell behind the API server")

// ErrShutdownOverdue is the cause of the cancellation of the reconciles still
// running when the instance's shutdown timeout ended: the Lease is left to
// expire, and they must return within Options.Lease.StopTimeout.
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
	// unit admits work in the ring's assignment unit: objectUnit or
	// *slotUnit, chosen once by Setup.
	unit unit

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
// The manager's cache must be the one NewCache makes with the same
// Options: cache selectors are fixed when the manager is created. Wrap each
// reconciler of the ring's main resources with the returned Instance.
//
// The instance runs in the unit of the ring NewCache read: in object mode
// for a ring of unit Objects, in slot mode (see the package documentation)
// for a ring of unit Slots, where it admits reconciles by its record of the
// slots it holds, read from the ring after it acquired its Lease. Setup
// returns an error wrapping ErrModeMismatch when the cache does not fit the
// ring (a cache NewCache made for another ring, or, for a manager whose
// cache NewCache did not make, a ring of unit Slots, which Setup reads
// then), and an error wrapping ErrShardedListAndWatch for
// Options.ShardedListAndWatch without a slot cache. An instance in slot
// mode checks the ring again when it starts: the manager then stops with
// such an error if the ring no longer fits.
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
	if err := i.chooseUnit(); err != nil {
		return nil, err
	}
	// The holder runs on the instance's handlers, which call the user's
	// after their own; a watch lag the instance does not check is no
	// promise (0 on the Lease).
	holderOpts := opts.Lease
	holderOpts.OnLost = i.lost
	holderOpts.BeforeRelease = i.beforeRelease
	holderOpts.MaxWatchLag = max(opts.Lease.MaxWatchLag, 0)
	i.holder, err = leaseholder.NewHolder(direct, holderOpts)
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

// Unit returns the assignment unit the instance runs in:
// v1alpha1.AssignmentUnitObjects or v1alpha1.AssignmentUnitSlots.
func (i *Instance) Unit() string {
	if _, ok := i.unit.slotRecord(); ok {
		return v1alpha1.AssignmentUnitSlots
	}
	return v1alpha1.AssignmentUnitObjects
}

// ShardStats counts the objects a slot cache selecting by shard received
// (Options.ShardedListAndWatch).
type ShardStats = slotcache.ShardStats

// ShardStats returns, in slot mode, the counts of the objects the cache's
// watches by shard received and of those outside the instance's slots
// (many when the API server ignores the shard selector); ok is false in
// object mode.
func (i *Instance) ShardStats() (stats ShardStats, ok bool) {
	s, ok := i.unit.(*slotUnit)
	if !ok {
		return ShardStats{}, false
	}
	return s.cache.ShardStats(), true
}

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
// Options.ShardedListAndWatch, an owner of a kind selected by shard that
// is not labelled yet (the instance saw it before the sharder labelled it)
// gives child the slot of its namespace, the slot the sharder will write on
// both.
func (i *Instance) LabelChild(owner, child metav1.Object) bool {
	return i.unit.labelChild(owner, child)
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
	return i.unit.slotRecord()
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
	return i.unit.run(ctx)
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

// assigned reports whether obj, of kind gk, is this instance's now (the
// unit's owns).
func (i *Instance) assigned(gk schema.GroupKind, obj metav1.Object) bool {
	return i.unit.owns(gk, obj)
}

// notify calls every notifier.
func (i *Instance) notify(call func(Notifier)) {
	i.mu.Lock()
	notifiers := slices.Clone(i.notifiers)
	i.mu.Unlock()
	for _, n := range notifiers {
		call(n)
	}
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
	i.unit.lost()
	i.log.Info("Instance lost its Lease, no longer reconciling")
	if i.opts.Lease.OnLost != nil {
		i.opts.Lease.OnLost()
	}
}

// beforeRelease is the Lease holder's BeforeRelease: admit no new reconcile
// and wait for those in flight, so that no other instance starts on an
// object this one is still working on; then the user's
// Options.Lease.BeforeRelease.
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
	if i.opts.Lease.BeforeRelease != nil {
		return i.opts.Lease.BeforeRelease(ctx)
	}
	return nil
}
