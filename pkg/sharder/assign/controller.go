package assign

import (
	"context"
	"errors"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/go-logr/logr"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/sharder/metrics"
)

// controllerName names the ring controller, its logger and its events.
const controllerName = "controllerring-assignment"

// +kubebuilder:rbac:groups=sharder.dev,resources=controllerrings,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=sharder.dev,resources=controllerrings/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch

// Controller is the assignment controller. It is a leader-only Runnable that
// runs, per ControllerRing, the caches and workers that assign the ring's
// objects. Build it with New and add it with SetupWithManager.
type Controller struct {
	opts     Options
	client   client.Client
	meta     metadata.Interface
	writer   metadata.Interface // label writes, with Options.WriteTimeout
	mapper   meta.ResettableRESTMapper
	recorder record.EventRecorder
	// logger is the manager's, named after the assignment: the rings'
	// machinery logs with it; reconciles log with their context's.
	logger logr.Logger

	started chan struct{} // closed once Start stored ctx
	ctx     context.Context

	mu sync.Mutex
	// rings runs each ring's machinery in its unit.
	rings map[string]ringRunner
}

var (
	_ manager.Runnable               = &Controller{}
	_ manager.LeaderElectionRunnable = &Controller{}
	_ reconcile.Reconciler           = &Controller{}
)

// New returns a Controller for opts, with defaults filled in.
func New(opts Options) (*Controller, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	return &Controller{
		opts:    opts,
		started: make(chan struct{}),
		rings:   map[string]ringRunner{},
	}, nil
}

// SetupWithManager adds the controller to mgr: a Runnable (leader only) that
// owns the per-ring machinery, and a controller watching ControllerRings.
func (c *Controller) SetupWithManager(mgr ctrl.Manager) error {
	if !mgr.GetScheme().Recognizes(v1alpha1.GroupVersion.WithKind("ControllerRing")) {
		return errors.New("the manager's scheme lacks sharder.dev/v1alpha1: call v1alpha1.AddToScheme")
	}
	cfg := c.opts.RESTConfig
	if cfg == nil {
		cfg = mgr.GetConfig()
	}
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = c.opts.QPS, c.opts.Burst
	if cfg.QPS < 0 {
		cfg.RateLimiter = nil
	}
	metaClient, err := metadata.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("creating metadata client: %w", err)
	}
	c.meta = metaClient
	// The label writes carry a deadline the API server enforces (client-go
	// sends the client's timeout as the request's timeout parameter).
	writeCfg := rest.CopyConfig(cfg)
	writeCfg.Timeout = c.opts.WriteTimeout
	if c.writer, err = metadata.NewForConfig(writeCfg); err != nil {
		return fmt.Errorf("creating metadata client: %w", err)
	}
	// The rings' resources are resolved with a mapper of their own, which
	// can be told to forget what it discovered: the manager's keeps the
	// versions it found for a group, so it would name a version a
	// CustomResourceDefinition recreated since no longer serves.
	discoveryClient, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return fmt.Errorf("creating discovery client: %w", err)
	}
	c.mapper = restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(discoveryClient))
	c.client = mgr.GetClient()
	c.recorder = c.opts.EventRecorder
	c.logger = mgr.GetLogger().WithName("assign")
	c.opts.Registry.Subscribe(c.membershipChanged)
	if err := mgr.Add(c); err != nil {
		return fmt.Errorf("adding assignment controller: %w", err)
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named(controllerName).
		For(&v1alpha1.ControllerRing{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Complete(c)
}

// NeedLeaderElection reports true: only the leader assigns.
func (c *Controller) NeedLeaderElection() bool { return true }

// Start runs until ctx is done, then stops every ring and waits for their
// workers to return.
func (c *Controller) Start(ctx context.Context) error {
	c.ctx = ctx
	close(c.started)
	<-ctx.Done()
	c.mu.Lock()
	rings := c.rings
	c.rings = map[string]ringRunner{}
	c.mu.Unlock()
	for _, r := range rings {
		r.stop()
	}
	return nil
}

// membershipChanged is the Registry subscription; it must not block.
func (c *Controller) membershipChanged(ring string) {
	c.mu.Lock()
	r := c.rings[ring]
	c.mu.Unlock()
	if r != nil {
		r.notifyMembership()
	}
}

// Reconcile starts, reconfigures or stops the machinery of one ring.
func (c *Controller) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	select {
	case <-c.started:
	case <-ctx.Done():
		return reconcile.Result{}, ctx.Err()
	}
	logger := logf.FromContext(ctx)
	ring := &v1alpha1.ControllerRing{}
	if err := c.client.Get(ctx, req.NamespacedName, ring); err != nil {
		if apierrors.IsNotFound(err) {
			c.stopRing(req.Name)
			c.opts.Rings.Forget(req.Name)
			metrics.ForgetRing(req.Name)
			logger.Info("Ring deleted: stopped its assignment")
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, fmt.Errorf("getting ring: %w", err)
	}
	if !ring.DeletionTimestamp.IsZero() {
		c.stopRing(ring.Name)
		if !controllerutil.ContainsFinalizer(ring, v1alpha1.FinalizerLabels) {
			return reconcile.Result{}, nil
		}
		logger.Info("Ring is being deleted: removing its labels")
		return reconcile.Result{}, c.finalize(ctx, ring)
	}
	if err := c.addFinalizer(ctx, ring); err != nil {
		return reconcile.Result{}, err
	}
	metrics.SetRingInfo(ring.Name, len(ring.Spec.InstanceServiceAccounts) > 0)

	unit := objectRings
	if ring.Spec.AssignsSlots() {
		unit = slotRings
	}
	if unit.refuse != nil {
		if reason, msg := unit.refuse(ring); reason != "" {
			c.stopRing(ring.Name)
			logger.Info("Ring cannot be served", "reason", reason, "message", msg)
			return reconcile.Result{}, c.writeNotReadyStatus(ctx, ring, reason, msg)
		}
	}
	c.mu.Lock()
	r := c.rings[ring.Name]
	c.mu.Unlock()
	if r != nil && r.unit() != unit.name {
		c.stopRing(ring.Name) // a ring of the same name served in the other unit before
		r = nil
	}
	cfg, err := resolveRing(ring, c.mapper, c.opts.NamespacedWatchLimit)
	if err == nil && (len(cfg.unresolved) > 0 || (r != nil && r.notServed())) {
		// Discovery may predate a CustomResourceDefinition installed,
		// deleted or recreated with other versions since: ask again.
		c.mapper.Reset()
		cfg, err = resolveRing(ring, c.mapper, c.opts.NamespacedWatchLimit)
	}
	if r != nil && err == nil && !r.keeps(cfg) {
		logger.Info(unit.restarting)
		c.stopRing(ring.Name)
		r = nil
	}
	if r == nil && err == nil {
		r, err = unit.build(c, ring, cfg)
	}
	if err != nil {
		c.stopRing(ring.Name)
		logger.Info("Ring spec is invalid", "error", err.Error())
		return reconcile.Result{}, c.writeNotReadyStatus(ctx, ring, v1alpha1.ReasonInvalidSpec,
			fmt.Sprintf("The ring's spec cannot be used: %v. Correct it; nothing is %s until then.", err, unit.done))
	}
	c.mu.Lock()
	started := c.rings[ring.Name] != r
	c.rings[ring.Name] = r
	c.mu.Unlock()
	switch {
	case started:
		r.start(c.ctx)
		logger.Info(unit.started, "resources", len(cfg.resources), "unresolved", len(cfg.unresolved))
	case !r.config().sameConfig(cfg):
		r.reconfigure(cfg)
	}
	// The ring's resources are resolved again periodically: a resource that
	// is not served may be installed later, or served at another version.
	return reconcile.Result{RequeueAfter: *c.opts.ResolveInterval}, nil
}

func (c *Controller) stopRing(name string) {
	c.mu.Lock()
	r := c.rings[name]
	delete(c.rings, name)
	c.mu.Unlock()
	if r != nil {
		r.stop()
	}
}

// writeNotReadyStatus reports a ring the controller does not run: Ready is
// False with reason and message, and a warning event says so when the
// reason or the message is new.
func (c *Controller) writeNotReadyStatus(ctx context.Context, ring *v1alpha1.ControllerRing, reason, message string) error {
	status := ring.Status.DeepCopy()
	status.ObservedGeneration = ring.Generation
	meta.SetStatusCondition(&status.Conditions, metav1.Condition{
		Type:               v1alpha1.ConditionReady,
		Status:             metav1.ConditionFalse,
		Reason:             reason,
		Message:            message,
		ObservedGeneration: ring.Generation,
	})
	if err := patchStatus(ctx, c.client, ring, status, c.opts.FieldManager); err != nil {
		return err
	}
	if old := meta.FindStatusCondition(ring.Status.Conditions, v1alpha1.ConditionReady); old == nil || old.Reason != reason || old.Message != message {
		ref := &v1alpha1.ControllerRing{
			TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "ControllerRing"},
			ObjectMeta: metav1.ObjectMeta{Name: ring.Name, UID: ring.UID},
		}
		c.recorder.Eventf(ref, corev1.EventTypeWarning, reason, "%s", message)
	}
	return nil
}
