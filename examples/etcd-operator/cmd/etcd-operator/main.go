// Command etcd-operator runs the example etcd operator as one instance of a
// sharder ring: it holds its instance Lease, caches only the EtcdClusters
// (and their children) assigned to it, and hands drained clusters back.
// Run as many replicas as you like; see examples/etcd-operator/README.md.
//
// The ring decides the mode: the operator reads its ring at start and runs
// in slot mode (docs/design.md §11: its cache follows the slots the sharder
// grants it) when the ring's spec.assignment.unit is Slots, in object mode
// otherwise. There is no flag to keep in step with the ring; a ring's unit
// never changes.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	crconfig "sigs.k8s.io/controller-runtime/pkg/config"

	"github.com/spf13/pflag"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	etcdv1alpha1 "github.com/sharder-dev/sharder/examples/etcd-operator/api/v1alpha1"
	"github.com/sharder-dev/sharder/examples/etcd-operator/internal/controller"
	"github.com/sharder-dev/sharder/internal/reconcilelog"
	"github.com/sharder-dev/sharder/pkg/instance"
	"github.com/sharder-dev/sharder/pkg/instance/leaseholder"
)

// reconcileLogEnv names the reconcile log file when --reconcile-log is not given.
const reconcileLogEnv = "ETCD_OPERATOR_RECONCILE_LOG"

// options are the command line settings.
type options struct {
	kubeconfig              string
	ring                    string
	leaseNamespace          string
	instance                string
	virtualNodes            int
	leaseDuration           time.Duration
	renewPeriod             time.Duration
	stopTimeout             time.Duration
	release                 string
	metricsBindAddress      string
	healthProbeBindAddress  string
	reconcileLog            string
	maxConcurrentReconciles int
	recoveryInterval        time.Duration
	etcdTimeout             time.Duration
	etcdCheckInterval       time.Duration
	progressInterval        time.Duration
	kubeAPIQPS              float32
	kubeAPIBurst            int
	restoreImage            string
	clockOffset             time.Duration
	shardedListAndWatch     bool
	zap                     zap.Options
	// repeatedRun lets run start in a process that ran it before (the
	// tests): controller-runtime refuses a controller name it has seen in
	// the process, since the metrics of the two would mix.
	repeatedRun bool
}

// parseFlags reads args (without the program name). Defaults that depend on
// the environment (instance ID, reconcile log) are resolved here.
func parseFlags(args []string, getenv func(string) string) (*options, error) {
	o := &options{}
	fs := pflag.NewFlagSet("etcd-operator", pflag.ContinueOnError)
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "Path to a kubeconfig. Default: $KUBECONFIG, the in-cluster config, or ~/.kube/config.")
	fs.StringVar(&o.ring, "ring", "etcd-operator", "Name of the ControllerRing this instance belongs to.")
	fs.StringVar(&o.leaseNamespace, "lease-namespace", "etcd-operator-system", "Namespace of the instance Leases: the ring's spec.leaseNamespace.")
	fs.StringVar(&o.instance, "instance", "", "Instance ID: name of the instance's Lease and value of the shard label on its objects. Default: $POD_NAME, else the hostname.")
	fs.IntVar(&o.virtualNodes, "virtual-nodes", 0, "Weight of this instance in the ring. Default 0: the ring's spec.virtualNodes.")
	fs.DurationVar(&o.leaseDuration, "lease-duration", 15*time.Second, "Duration of the instance Lease (whole seconds).")
	fs.DurationVar(&o.renewPeriod, "renew-period", 0, "Time between Lease renewals. Default: a third of --lease-duration.")
	fs.DurationVar(&o.stopTimeout, "stop-timeout", 0, "Bound on stopping: a reconcile cancelled because the instance may no longer act (its Lease lost, its cluster moved away) must return within it, or the process exits. Default: --lease-duration less the renew deadline (a third of --lease-duration).")
	fs.StringVar(&o.release, "release", string(leaseholder.ReleaseStop), "How the instance hands its Lease back on a graceful stop: Restart (it comes back with the same ID, as a StatefulSet's pod: the sharder keeps its objects for the ring's restartHold) or Stop (its objects move at once).")
	fs.StringVar(&o.metricsBindAddress, "metrics-bind-address", ":8080", `Address of the metrics endpoint; "0" turns it off.`)
	fs.StringVar(&o.healthProbeBindAddress, "health-probe-bind-address", ":8081", `Address of /healthz and /readyz; "0" turns it off.`)
	fs.StringVar(&o.reconcileLog, "reconcile-log", "", "File to append a JSON line to when each reconcile starts and ends. Default: $"+reconcileLogEnv+", else none.")
	fs.IntVar(&o.maxConcurrentReconciles, "max-concurrent-reconciles", 4, "Number of EtcdClusters reconciled at once.")
	fs.DurationVar(&o.recoveryInterval, "recovery-interval", 30*time.Second, "How soon a Failed cluster is retried when nothing it watches changes.")
	fs.DurationVar(&o.etcdTimeout, "etcd-timeout", 5*time.Second, "Bound on one reconcile's calls to a cluster's etcd (member list, each member's status).")
	fs.DurationVar(&o.etcdCheckInterval, "etcd-check-interval", 15*time.Second, "How soon a cluster that is not Failed is reconciled again to ask etcd for its members, leader and health.")
	fs.DurationVar(&o.progressInterval, "progress-interval", 2*time.Second, "How soon a cluster whose members are being added, promoted, removed or restarted is reconciled again for the next step.")
	fs.Float32Var(&o.kubeAPIQPS, "kube-api-qps", 50, "Requests per second to the API server (client-side limit). Drain acknowledgements share it with reconciles, so a low limit slows moves.")
	fs.IntVar(&o.kubeAPIBurst, "kube-api-burst", 100, "Burst of requests to the API server above --kube-api-qps.")
	fs.StringVar(&o.restoreImage, "restore-image", "", "Image of this operator: the members of a cluster an EtcdRestore creates run its restore-member subcommand before etcd. Empty: EtcdRestores fail with the reason NoRestoreImage.")
	fs.BoolVar(&o.shardedListAndWatch, "sharded-list-and-watch", false, "Slot mode on a ring whose slots are keyed by namespace (spec.assignment.slots.key: Namespace) only: "+
		"watch this instance's slots with the API server's shard selector on the namespace instead of the slot label, so that a new EtcdCluster is reconciled before the sharder labels it. "+
		"Needs Kubernetes 1.36+ with the ShardedListAndWatch feature gate: a server without it ignores the selector, and the operator, which checks each object's slot itself, still reconciles only its slots but receives every object in each of its watch groups. "+
		"The operator refuses to start with it on any other ring.")
	fs.DurationVar(&o.clockOffset, "clock-offset", 0, "Moves this process's wall clock by the offset, as on a node whose clock runs ahead or lags (fault-injection tests); elapsed times are unaffected.")
	_ = fs.MarkHidden("clock-offset")
	zfs := flag.NewFlagSet("zap", flag.ContinueOnError)
	o.zap.BindFlags(zfs)
	fs.AddGoFlagSet(zfs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if o.reconcileLog == "" {
		o.reconcileLog = getenv(reconcileLogEnv)
	}
	if o.instance == "" {
		id, err := instance.DefaultIdentity()
		if err != nil {
			return nil, fmt.Errorf("finding the instance ID (set --instance): %w", err)
		}
		o.instance = id
	}
	var errs []error
	if o.ring == "" {
		errs = append(errs, errors.New("--ring must not be empty"))
	}
	if o.leaseNamespace == "" {
		errs = append(errs, errors.New("--lease-namespace must not be empty"))
	}
	if o.maxConcurrentReconciles < 1 {
		errs = append(errs, fmt.Errorf("--max-concurrent-reconciles must be at least 1, got %d", o.maxConcurrentReconciles))
	}
	if o.etcdTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--etcd-timeout must be positive, got %s", o.etcdTimeout))
	}
	if o.etcdCheckInterval <= 0 {
		errs = append(errs, fmt.Errorf("--etcd-check-interval must be positive, got %s", o.etcdCheckInterval))
	}
	if o.progressInterval <= 0 {
		errs = append(errs, fmt.Errorf("--progress-interval must be positive, got %s", o.progressInterval))
	}
	if o.recoveryInterval <= 0 {
		errs = append(errs, fmt.Errorf("--recovery-interval must be positive, got %s", o.recoveryInterval))
	}
	return o, errors.Join(errs...)
}

// ownerPod is the instance's Pod as the Lease's owner, when the Downward API
// provides its name and UID (POD_NAME, POD_UID): garbage collection then
// removes the Lease with the Pod.
func ownerPod(getenv func(string) string) *metav1.OwnerReference {
	name, uid := getenv("POD_NAME"), getenv("POD_UID")
	if name == "" || uid == "" {
		return nil
	}
	return &metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: name, UID: types.UID(uid)}
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	return config.GetConfig()
}

func newScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(etcdv1alpha1.AddToScheme(s))
	return s
}

// cachedObjects are the resources the instance caches, each with the shard
// label selector: the ring (config/ring) must cover every one of them, or
// the instance never sees the objects of the missing ones.
func cachedObjects() []client.Object {
	return []client.Object{&etcdv1alpha1.EtcdCluster{}, &corev1.ConfigMap{}, &corev1.Service{},
		&appsv1.StatefulSet{}, &policyv1.PodDisruptionBudget{}, &corev1.Pod{}, &corev1.Secret{},
		&etcdv1alpha1.EtcdBackup{}, &etcdv1alpha1.EtcdRestore{}}
}

// Leases are read and written in the lease namespace only.
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update;patch,namespace=etcd-operator-system

// The ring is read at start (instance.NewCache: its unit decides the
// cache) and, in slot mode, followed by the instance (its slot table).
// +kubebuilder:rbac:groups=sharder.dev,resources=controllerrings,verbs=get;list;watch

func run(ctx context.Context, o *options) error {
	log := ctrl.Log.WithName("setup")
	cfg, err := restConfig(o.kubeconfig)
	if err != nil {
		return fmt.Errorf("loading kubeconfig: %w", err)
	}
	cfg.QPS, cfg.Burst = o.kubeAPIQPS, o.kubeAPIBurst

	instOpts := instance.Options{
		Ring:                o.ring,
		Identity:            o.instance,
		ShardedListAndWatch: o.shardedListAndWatch,
		Lease: leaseholder.Options{
			Namespace:     o.leaseNamespace,
			VirtualNodes:  o.virtualNodes,
			LeaseDuration: o.leaseDuration,
			RenewPeriod:   o.renewPeriod,
			StopTimeout:   o.stopTimeout,
			Release:       leaseholder.Release(o.release),
			Pod:           ownerPod(os.Getenv),
			Clock:         skewedClock{offset: o.clockOffset},
		},
	}
	// The cache holds only this instance's objects of the ring's resources:
	// the clusters and everything the clusters control, down to the pods
	// (in slot mode, those of the slots it holds). instance.NewCache reads
	// the ring and makes the cache of its unit.
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 newScheme(),
		NewCache:               instance.NewCache(instOpts, cachedObjects()...),
		Metrics:                metricsserver.Options{BindAddress: o.metricsBindAddress},
		HealthProbeBindAddress: o.healthProbeBindAddress,
		// No leader election: every instance works, on its own objects.
		LeaderElection: false,
		Controller:     crconfig.Controller{SkipNameValidation: ptr.To(o.repeatedRun)},
	})
	if errors.Is(err, instance.ErrShardedListAndWatch) {
		return fmt.Errorf("--sharded-list-and-watch needs a ring of unit Slots whose slots are keyed by namespace "+
			"(spec.assignment.unit: Slots, spec.assignment.slots.key: Namespace); drop the flag, or create the ring in slot mode: %w", err)
	}
	if err != nil {
		return fmt.Errorf("creating manager: %w", err)
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return fmt.Errorf("adding health check: %w", err)
	}

	inst, err := instance.Setup(mgr, instOpts)
	if err != nil {
		return fmt.Errorf("setting up the instance: %w", err)
	}

	var rlog *reconcilelog.Log
	if o.reconcileLog != "" {
		if rlog, err = reconcilelog.Open(o.reconcileLog, o.instance, nil); err != nil {
			return err
		}
		defer func() { _ = rlog.Close() }()
	}

	r := controller.NewReconciler(mgr.GetClient(), mgr.GetScheme(), mgr.GetEventRecorder("etcd-operator"), controller.Options{
		LabelChild:              func(owner, child client.Object) { inst.LabelChild(owner, child) },
		APIReader:               mgr.GetAPIReader(),
		RecoveryInterval:        o.recoveryInterval,
		EtcdTimeout:             o.etcdTimeout,
		EtcdCheckInterval:       o.etcdCheckInterval,
		ProgressInterval:        o.progressInterval,
		MaxConcurrentReconciles: o.maxConcurrentReconciles,
		Wrap: func(next reconcile.Reconciler) (reconcile.Reconciler, error) {
			// The log sits inside the instance's wrapper: it records the
			// reconciles the instance admitted, not drain acknowledgements.
			if rlog != nil {
				next = rlog.Wrap(next)
			}
			return inst.Wrap(&etcdv1alpha1.EtcdCluster{}, next)
		},
	})
	if err := r.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the controller: %w", err)
	}
	if err := setupBackupAndRestore(mgr, inst, rlog, o); err != nil {
		return err
	}

	log.Info("Starting", "ring", o.ring, "instance", o.instance, "leaseNamespace", o.leaseNamespace, "unit", inst.Unit(),
		"shardedListAndWatch", o.shardedListAndWatch)
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("running manager: %w", err)
	}
	return nil
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == controller.RestoreMemberCommand {
		os.Exit(restoreMember(os.Args[2:]))
	}
	o, err := parseFlags(os.Args[1:], os.Getenv)
	if errors.Is(err, pflag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcd-operator:", err)
		os.Exit(2)
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&o.zap)))
	if err := run(ctrl.SetupSignalHandler(), o); err != nil {
		ctrl.Log.Error(err, "Exiting")
		os.Exit(1)
	}
}

// skewedClock is the real clock with its wall time moved by offset
// (--clock-offset). Elapsed times, measured with Go's monotonic clock, are
// not affected, as on a node whose clock is off.
type skewedClock struct {
	clock.RealClock
	offset time.Duration
}

func (c skewedClock) Now() time.Time                  { return time.Now().Add(c.offset) }
func (c skewedClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }
