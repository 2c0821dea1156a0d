package instance_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/sharder-dev/sharder/internal/reconcilelog"
	"github.com/sharder-dev/sharder/internal/testenv"
	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/instance"
	"github.com/sharder-dev/sharder/pkg/instance/leaseholder"
)

var suite testenv.Suite // the control plane, started for the first test that calls env

func env() *testenv.Env { return suite.Env() }

func TestMain(m *testing.M) {
	if os.Getenv("TEST_LOG") != "" {
		ctrl.SetLogger(zap.New(zap.UseDevMode(true)))
	} else {
		ctrl.SetLogger(logr.Discard())
	}
	scheme := testenv.DefaultScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	opts := testenv.Options{CRDDirectoryPaths: []string{"config/crd/bases"}, Scheme: scheme}
	os.Exit(testenv.RunSuites(m, map[*testenv.Suite]testenv.Options{&suite: opts, &gatedSuite: gatedOptions(opts)}))
}

// interval is one run of a user reconciler.
type interval struct {
	instance, controller string
	start, end           time.Time
	notFound             bool
}

// recorder keeps what every instance did, per ConfigMap name.
type recorder struct {
	mu       sync.Mutex
	runs     map[string][]interval
	requests map[string]int // requests handed to the wrapped reconcilers, per instance/controller/name
	gained   map[string]map[string]time.Time
	drained  map[string]map[string]int
	lost     map[string]map[string]int
}

func newRecorder() *recorder {
	return &recorder{
		runs:     map[string][]interval{},
		requests: map[string]int{},
		gained:   map[string]map[string]time.Time{},
		drained:  map[string]map[string]int{},
		lost:     map[string]map[string]int{},
	}
}

func (r *recorder) run(name string, iv interval) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.runs[name] = append(r.runs[name], iv)
}

func (r *recorder) request(id, controller, name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.requests[id+"/"+controller+"/"+name]++
}

func (r *recorder) requestsOf(id, controller, name string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.requests[id+"/"+controller+"/"+name]
}

// runsOf returns the runs of name, optionally only by instance id.
func (r *recorder) runsOf(name, id string) []interval {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []interval
	for _, iv := range r.runs[name] {
		if id == "" || iv.instance == id {
			out = append(out, iv)
		}
	}
	return out
}

func count(m map[string]map[string]int, id, name string) int {
	return m[id][name]
}

func (r *recorder) drainedOf(id, name string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return count(r.drained, id, name)
}

func (r *recorder) lostOf(id, name string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return count(r.lost, id, name)
}

func (r *recorder) gainedAt(id, name string) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.gained[id][name]
	return t, ok
}

func (r *recorder) drainedTotal(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.drained[id] {
		n += c
	}
	return n
}

func (r *recorder) notifier(id string) instance.Notifier {
	bump := func(m map[string]map[string]int, obj client.Object) {
		r.mu.Lock()
		defer r.mu.Unlock()
		if m[id] == nil {
			m[id] = map[string]int{}
		}
		m[id][obj.GetName()]++
	}
	return instance.NotifierFuncs{
		GainedFunc: func(obj client.Object) {
			r.mu.Lock()
			defer r.mu.Unlock()
			if r.gained[id] == nil {
				r.gained[id] = map[string]time.Time{}
			}
			r.gained[id][obj.GetName()] = time.Now()
		},
		DrainedFunc: func(obj client.Object) { bump(r.drained, obj) },
		LostFunc:    func(obj client.Object) { bump(r.lost, obj) },
	}
}

// overlaps returns a description of every pair of runs of one object by two
// instances at overlapping times.
func (r *recorder) overlaps() []string {
	r.mu.Lock()
	var all []reconcilelog.Interval
	for name, runs := range r.runs {
		for _, run := range runs {
			all = append(all, reconcilelog.Interval{Instance: run.instance, Object: name, Start: run.start, End: run.end})
		}
	}
	r.mu.Unlock()
	var out []string
	for _, o := range reconcilelog.Overlaps(all) {
		out = append(out, o.String())
	}
	return out
}

// instanceConfig describes a test instance: a manager of its own with the
// instance's label-selected cache, two controllers on ConfigMaps and the
// instance's Lease holder.
type instanceConfig struct {
	ring, namespace, id string
	rec                 *recorder
	// work is how long each reconcile of controller "a" works; controller
	// "b" works a tenth of it.
	work time.Duration
	// requeueAfter, when set, is what the user reconcilers ask for after
	// each run: they keep reconciling their objects from their cache.
	requeueAfter time.Duration
	// hook, when set, runs inside the user reconciler of each controller
	// ("a" or "b") before the work.
	hook func(ctx context.Context, controller string, req reconcile.Request)
	// leaseDuration and renewPeriod of the instance's Lease.
	leaseDuration, renewPeriod time.Duration
	// onLost is the instance's OnLost; when set, the manager stopping on the
	// lost Lease is not an error. Default: the test fails.
	onLost func()
	// restConfig, when set, is the instance's connection to the API server
	// (default: the test environment's).
	restConfig *rest.Config
	// absentHandled, when set, is called after a wrapped reconcile of an
	// object that was not in the instance's cache when the request started.
	absentHandled func(controller string, req reconcile.Request)
	// stopTimeout is the instance's StopTimeout (default: the instance's).
	stopTimeout time.Duration
	// onStopOverdue is the instance's OnStopOverdue. Default: nothing (the
	// test process must not exit; the reconcilers here model slow work by
	// sleeping through their cancellation).
	onStopOverdue func(running int)
}

type testInstance struct {
	id     string
	inst   *instance.Instance
	cancel context.CancelFunc
	done   chan struct{} // closed when the manager returned
	err    error
}

// stop shuts the instance down gracefully and waits for it.
func (ti *testInstance) stop(t *testing.T) {
	t.Helper()
	ti.cancel()
	select {
	case <-ti.done:
		if ti.err != nil {
			t.Errorf("instance %s: %v", ti.id, ti.err)
		}
	case <-time.After(30 * time.Second):
		t.Errorf("instance %s did not stop", ti.id)
	}
}

func controllerOptions() controller.Options {
	return controller.Options{MaxConcurrentReconciles: 4}
}

func startInstance(t *testing.T, cfg instanceConfig) *testInstance {
	t.Helper()
	if cfg.leaseDuration == 0 {
		// Renew deadline 2 s (2/3 of it) with renewals every 300 ms: room
		// for a few slow round trips on a loaded machine before an instance
		// that nobody wants to lose gives its Lease up.
		cfg.leaseDuration = 3 * time.Second
	}
	if cfg.renewPeriod == 0 {
		cfg.renewPeriod = 300 * time.Millisecond
	}
	if cfg.onStopOverdue == nil {
		cfg.onStopOverdue = func(int) {}
	}
	expectLoss := cfg.onLost != nil
	if !expectLoss {
		cfg.onLost = func() { t.Errorf("instance %s lost its Lease", cfg.id) }
	}
	instOpts := instance.Options{
		Ring:          cfg.ring,
		Identity:      cfg.id,
		RetryPeriod:   100 * time.Millisecond,
		OnStopOverdue: cfg.onStopOverdue,
		Lease: leaseholder.Options{
			Namespace:     cfg.namespace,
			LeaseDuration: cfg.leaseDuration,
			RenewPeriod:   cfg.renewPeriod,
			OnLost:        cfg.onLost,
			StopTimeout:   cfg.stopTimeout,
		},
	}
	mgrOpts := env().ManagerOptions()
	mgrOpts.Cache = cache.Options{DefaultNamespaces: map[string]cache.Config{cfg.namespace: {}}}
	mgrOpts.NewCache = instance.NewCache(instOpts, &corev1.ConfigMap{})
	mgrOpts.Logger = ctrl.Log.WithName(cfg.id)
	mgr := env().NewManager(t, cfg.restConfig, mgrOpts)
	inst, err := instance.Setup(mgr, instOpts)
	if err != nil {
		t.Fatal(err)
	}
	inst.AddNotifier(cfg.rec.notifier(cfg.id))
	c := mgr.GetClient()
	for _, name := range []string{"a", "b"} {
		user := reconcile.Func(func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
			iv := interval{instance: cfg.id, controller: name, start: time.Now()}
			defer func() {
				iv.end = time.Now()
				cfg.rec.run(req.Name, iv)
			}()
			cm := &corev1.ConfigMap{}
			if err := c.Get(ctx, req.NamespacedName, cm); err != nil {
				if apierrors.IsNotFound(err) {
					iv.notFound = true
					return reconcile.Result{}, nil
				}
				return reconcile.Result{}, err
			}
			if cfg.hook != nil {
				cfg.hook(ctx, name, req)
			}
			if name == "a" { // the controller's work
				time.Sleep(cfg.work)
			} else {
				time.Sleep(cfg.work / 10)
			}
			return reconcile.Result{RequeueAfter: cfg.requeueAfter}, nil
		})
		wrapped, err := inst.Wrap(&corev1.ConfigMap{}, user)
		if err != nil {
			t.Fatal(err)
		}
		counting := reconcile.Func(func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
			cfg.rec.request(cfg.id, name, req.Name)
			if cfg.absentHandled == nil {
				return wrapped.Reconcile(ctx, req)
			}
			absent := apierrors.IsNotFound(mgr.GetCache().Get(ctx, req.NamespacedName, &corev1.ConfigMap{}))
			res, err := wrapped.Reconcile(ctx, req)
			if absent {
				cfg.absentHandled(name, req)
			}
			return res, err
		})
		err = ctrl.NewControllerManagedBy(mgr).
			Named("configmap-" + name).
			For(&corev1.ConfigMap{}).
			WithOptions(controllerOptions()).
			Complete(counting)
		if err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	ti := &testInstance{id: cfg.id, inst: inst, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(ti.done)
		err := mgr.Start(ctx)
		if expectLoss && errors.Is(err, instance.ErrLeaseLost) {
			return // the holder stops the manager after OnLost
		}
		if err != nil && !errors.Is(err, context.Canceled) {
			ti.err = err
		}
	}()
	t.Cleanup(func() { ti.stop(t) })
	return ti
}
