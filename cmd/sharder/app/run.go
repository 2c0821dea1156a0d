package app

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"runtime/debug"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/sharder/assign"
	"github.com/sharder-dev/sharder/pkg/sharder/config"
	"github.com/sharder-dev/sharder/pkg/sharder/eventrecorder"
	"github.com/sharder-dev/sharder/pkg/sharder/leasecontroller"
	"github.com/sharder-dev/sharder/pkg/sharder/metrics"
	"github.com/sharder-dev/sharder/pkg/sharder/ringbuilds"
	"github.com/sharder-dev/sharder/pkg/sharder/slottable"
	"github.com/sharder-dev/sharder/pkg/sharder/webhook"
)

// The metrics endpoint checks callers with TokenReviews and
// SubjectAccessReviews when it is served beyond localhost.
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// The leader election Lease lives in the sharder's own namespace; the
// namespaced Role in config/rbac grants it. Events record elections.
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// runOptions are the inputs of `sharder run`: the configuration (file, then
// flags) and the cluster to talk to.
type runOptions struct {
	cluster    clusterFlags
	configFile string
	cfg        *config.Config

	// namespace is the namespace the sharder runs in (filled by complete).
	namespace string
	// newManager creates the manager from the options `sharder run` built.
	// Default: ctrl.NewManager.
	newManager func(*rest.Config, manager.Options) (manager.Manager, error)

	// logOutput is where logs go. Default: the command's stderr.
	logOutput io.Writer
}

// NewRunCommand returns `sharder run`.
func NewRunCommand() *cobra.Command {
	return newRunCommand(&runOptions{cfg: config.Default()})
}

// newRunCommand returns `sharder run` working on o, whose cfg holds the
// defaults.
func newRunCommand(o *runOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the sharder (leader-elected assignment, lease controller and webhook)",
		Long: `Run the sharder. Every replica serves the label-protecting webhook; the elected
leader also runs the lease controller (instance membership) and the assignment
controller (shard labels, moves, drains).

Settings come from the defaults, then the --config file, then flags: a flag
given on the command line wins over the file.`,
		Example: `  sharder run --config /etc/sharder/config.yaml
  sharder run --kubeconfig ~/.kube/config --leader-elect=false --webhook=false --metrics-secure=false --metrics-bind-address 127.0.0.1:8080`,
		Args: cobra.NoArgs,
		PreRunE: func(cmd *cobra.Command, _ []string) error {
			return o.complete(cmd.Flags())
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.logOutput == nil {
				o.logOutput = cmd.ErrOrStderr()
			}
			return o.run(cmd.Context())
		},
	}
	o.addFlags(cmd.Flags())
	_ = cmd.MarkFlagFilename("config", "yaml", "yml", "json")
	_ = cmd.RegisterFlagCompletionFunc("log-format", cobra.FixedCompletions([]string{config.LogFormatJSON, config.LogFormatConsole}, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("log-level", cobra.FixedCompletions([]string{"debug", "info", "error"}, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("webhook-cert-mode", cobra.FixedCompletions([]string{config.CertModeSelfManaged, config.CertModeExternal}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

// addFlags binds every flag to its field of o.cfg. The flag defaults shown
// in --help are config.Default's values.
func (o *runOptions) addFlags(fs *pflag.FlagSet) {
	c := o.cfg
	o.cluster.addFlags(fs)
	fs.StringVar(&o.configFile, "config", "", "Path to the configuration file (YAML, kind SharderConfiguration). Flags given on the command line override it.")

	fs.BoolVar(&c.LeaderElection.Enabled, "leader-elect", c.LeaderElection.Enabled, "Elect a leader among sharder replicas. Turn off only when exactly one sharder runs.")
	fs.StringVar(&c.LeaderElection.Namespace, "leader-election-namespace", c.LeaderElection.Namespace, "Namespace of the leader election Lease. Default: the namespace the sharder runs in.")
	fs.StringVar(&c.LeaderElection.LeaseName, "leader-election-id", c.LeaderElection.LeaseName, "Name of the leader election Lease.")
	fs.DurationVar(&c.LeaderElection.LeaseDuration.Duration, "leader-election-lease-duration", c.LeaderElection.LeaseDuration.Duration, "How long a leader's Lease is valid without renewal.")
	fs.DurationVar(&c.LeaderElection.RenewDeadline.Duration, "leader-election-renew-deadline", c.LeaderElection.RenewDeadline.Duration, "How long the leader retries renewing before it exits.")
	fs.DurationVar(&c.LeaderElection.RetryPeriod.Duration, "leader-election-retry-period", c.LeaderElection.RetryPeriod.Duration, "Wait between attempts to acquire or renew the leader Lease.")

	fs.Float32Var(&c.Client.QPS, "kube-api-qps", c.Client.QPS, "Requests per second the sharder allows itself against the API server (-1: no client-side limit).")
	fs.IntVar(&c.Client.Burst, "kube-api-burst", c.Client.Burst, "Requests allowed above --kube-api-qps in short bursts.")

	fs.IntVar(&c.Controllers.Assignment.Workers, "assignment-workers", c.Controllers.Assignment.Workers, "Objects labelled or moved in parallel.")
	fs.IntVar(&c.Controllers.Assignment.NamespacedWatchLimit, "namespaced-watch-limit", c.Controllers.Assignment.NamespacedWatchLimit,
		"Most namespaces a ring's resources are watched in one by one, when its namespaceSelector names them (kubernetes.io/metadata.name); 0 watches every ring across the cluster.")
	fs.DurationVar(&c.Controllers.Assignment.ResyncPeriod.Duration, "resync-period", c.Controllers.Assignment.ResyncPeriod.Duration, "How often every ring is recomputed from the caches.")

	fs.IntVar(&c.Controllers.Leases.Workers, "lease-workers", c.Controllers.Leases.Workers, "Instance Leases reconciled in parallel.")

	fs.BoolVar(&c.Webhook.Enabled, "webhook", c.Webhook.Enabled, "Serve the webhook that protects shard and drain labels.")
	fs.IntVar(&c.Webhook.Port, "webhook-port", c.Webhook.Port, "Port of the webhook server (TLS).")
	fs.StringVar(&c.Webhook.CertDir, "webhook-cert-dir", c.Webhook.CertDir, "Folder holding the webhook's tls.crt and tls.key.")
	fs.StringVar(&c.Webhook.CertMode, "webhook-cert-mode", c.Webhook.CertMode, "Who provides the webhook certificate: self-managed (the sharder) or external (e.g. cert-manager).")
	fs.StringVar(&c.Webhook.ServiceName, "webhook-service-name", c.Webhook.ServiceName, "Service in front of the webhook; the certificate is issued for it.")
	fs.StringVar(&c.Webhook.ServiceNamespace, "webhook-service-namespace", c.Webhook.ServiceNamespace, "Namespace of the webhook Service. Default: the namespace the sharder runs in.")
	fs.IntVar(&c.Webhook.ServicePort, "webhook-service-port", c.Webhook.ServicePort, "Port of the webhook Service.")
	fs.StringVar(&c.Webhook.URL, "webhook-url", c.Webhook.URL, "Base URL (https://host[:port]) the API server calls instead of the Service, for a sharder outside the cluster.")
	fs.StringVar(&c.Webhook.ConfigurationName, "webhook-configuration-name", c.Webhook.ConfigurationName, "Name of the ValidatingWebhookConfiguration the sharder keeps.")
	fs.IntVar(&c.Webhook.TimeoutSeconds, "webhook-timeout-seconds", c.Webhook.TimeoutSeconds, "How long the API server waits for the webhook (1-30) before it applies the ring's failure policy.")
	fs.StringVar(&c.Webhook.SecretName, "webhook-secret-name", c.Webhook.SecretName, "Secret holding the self-managed CA and certificate.")
	fs.StringVar(&c.Webhook.OwnerClusterRole, "webhook-owner-cluster-role", c.Webhook.OwnerClusterRole, "ClusterRole of the install that owns the webhook configuration, so that removing the install removes it.")
	fs.StringVar(&c.Webhook.CAInjectFrom, "webhook-ca-inject-from", c.Webhook.CAInjectFrom, "External mode with cert-manager: <namespace>/<name> of the Certificate whose CA is injected into the webhook configuration.")

	fs.StringVar(&c.Metrics.BindAddress, "metrics-bind-address", c.Metrics.BindAddress, "Address of the metrics endpoint; 0 turns it off.")
	fs.BoolVar(&c.Metrics.Secure, "metrics-secure", c.Metrics.Secure, "Serve metrics over HTTPS to authenticated, authorized clients only. May be false only on a loopback address.")
	fs.StringVar(&c.Metrics.CertDir, "metrics-cert-dir", c.Metrics.CertDir, "Folder holding tls.crt and tls.key for the metrics endpoint. Default: a self-signed certificate.")
	fs.StringVar(&c.Health.BindAddress, "health-probe-bind-address", c.Health.BindAddress, "Address of /healthz and /readyz; 0 turns them off.")
	fs.StringVar(&c.Pprof.BindAddress, "pprof-bind-address", c.Pprof.BindAddress, "Address of /debug/pprof/; empty or 0 (default) turns profiling off.")

	fs.StringVar(&c.Logging.Format, "log-format", c.Logging.Format, "Log format: json or console.")
	fs.StringVar(&c.Logging.Level, "log-level", c.Logging.Level, "Log level: debug, info, error, or a verbosity number.")
	fs.DurationVar(&c.ShutdownTimeout.Duration, "shutdown-timeout", c.ShutdownTimeout.Duration, "How long to wait for a graceful stop after SIGTERM.")
}

// complete loads the configuration file, lets the flags given on the command
// line win over it, fills in the namespace and validates the result.
func (o *runOptions) complete(fs *pflag.FlagSet) error {
	if o.configFile != "" {
		given := map[string]string{}
		fs.Visit(func(f *pflag.Flag) { given[f.Name] = f.Value.String() })
		if err := config.LoadFile(o.configFile, o.cfg); err != nil {
			return err
		}
		for name, value := range given {
			if err := fs.Set(name, value); err != nil {
				return fmt.Errorf("applying --%s: %w", name, err)
			}
		}
	}
	if err := o.cfg.Validate(); err != nil {
		return fmt.Errorf("invalid configuration: %w", err)
	}
	ns, err := o.cluster.namespace()
	if err != nil {
		return err
	}
	o.namespace = ns
	if o.cfg.LeaderElection.Namespace == "" {
		o.cfg.LeaderElection.Namespace = ns
	}
	if o.cfg.Webhook.ServiceNamespace == "" {
		o.cfg.Webhook.ServiceNamespace = ns
	}
	return nil
}

// newScheme returns the types the sharder reads and writes as typed objects.
func newScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(v1alpha1.AddToScheme(s))
	return s
}

func (o *runOptions) run(ctx context.Context) error {
	log, err := newLogger(o.cfg.Logging, o.logOutput)
	if err != nil {
		return err
	}
	setProcessLoggers(log)
	if gcPercent, set := defaultGCPercent(os.Getenv); set {
		debug.SetGCPercent(gcPercent)
		log.V(1).Info("Garbage collection target set", "gcPercent", gcPercent)
	}
	if limit, set, err := memoryLimit(os.Getenv); err != nil {
		log.Error(err, "Ignoring the container's memory limit", "env", memoryLimitEnv)
	} else if set {
		debug.SetMemoryLimit(limit)
		log.V(1).Info("Soft memory limit set from the container's", "bytes", limit, "env", memoryLimitEnv)
	}

	restConfig, err := o.cluster.restConfig()
	if err != nil {
		return err
	}
	restConfig.QPS = o.cfg.Client.QPS
	restConfig.Burst = o.cfg.Client.Burst

	// The manager's metrics endpoint serves controller-runtime's registry.
	if err := metrics.Register(crmetrics.Registry); err != nil {
		return err
	}
	newMgr := o.newManager
	if newMgr == nil {
		newMgr = ctrl.NewManager
	}
	leader, err := newLeaderLock(restConfig, o.cfg.LeaderElection)
	if err != nil {
		return err
	}
	mgr, err := newManager(newMgr, restConfig, o.cfg, log, leader)
	if err != nil {
		return err
	}
	if err := setupParts(mgr, o.cfg, o.namespace, leader); err != nil {
		return err
	}
	log.Info("Starting sharder", "version", Version(),
		"leaderElection", o.cfg.LeaderElection.Enabled,
		"namespace", o.namespace,
		"leaderElectionNamespace", o.cfg.LeaderElection.Namespace,
		"webhook", o.cfg.Webhook.Enabled)
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("running the sharder: %w", err)
	}
	log.Info("Sharder stopped")
	return nil
}

// newManager builds the controller-runtime manager of cfg: leader election
// (released on cancel), caches, webhook server, metrics, probes and pprof.
func newManager(create func(*rest.Config, manager.Options) (manager.Manager, error),
	restConfig *rest.Config, cfg *config.Config, log logr.Logger, leader *leaderLock) (manager.Manager, error) {
	le := cfg.LeaderElection
	shutdown := cfg.ShutdownTimeout.Duration
	opts := manager.Options{
		Scheme: newScheme(),
		Logger: log,
		Cache:  cache.Options{ByObject: cacheByObject()},

		LeaderElection:                le.Enabled,
		LeaderElectionID:              le.LeaseName,
		LeaderElectionNamespace:       le.Namespace,
		LeaderElectionResourceLock:    "leases",
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 &le.LeaseDuration.Duration,
		RenewDeadline:                 &le.RenewDeadline.Duration,
		RetryPeriod:                   &le.RetryPeriod.Duration,

		LeaderElectionResourceLockInterface: leader.lock(),

		Metrics:                 metricsOptions(cfg.Metrics),
		HealthProbeBindAddress:  cfg.Health.BindAddress,
		PprofBindAddress:        cfg.Pprof.BindAddress,
		GracefulShutdownTimeout: &shutdown,
	}
	if cfg.Webhook.Enabled {
		opts.WebhookServer = ctrlwebhook.NewServer(ctrlwebhook.Options{
			Port:    cfg.Webhook.Port,
			CertDir: cfg.Webhook.CertDir,
			TLSOpts: []func(*tls.Config){hardenTLS},
		})
	}
	mgr, err := create(restConfig, opts)
	if err != nil {
		return nil, fmt.Errorf("creating the manager: %w", err)
	}

	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return nil, fmt.Errorf("adding liveness check: %w", err)
	}
	if err := mgr.AddReadyzCheck("caches", cachesSynced(mgr.GetCache())); err != nil {
		return nil, fmt.Errorf("adding readiness check: %w", err)
	}
	if cfg.Webhook.Enabled {
		// Ready only once the webhook answers TLS on its port: a replica
		// without a certificate must not receive admission requests.
		if err := mgr.AddReadyzCheck("webhook", mgr.GetWebhookServer().StartedChecker()); err != nil {
			return nil, fmt.Errorf("adding readiness check: %w", err)
		}
	}
	return mgr, nil
}

// metricsOptions serves metrics over HTTPS with authentication and
// authorization against the API server, unless the configuration keeps
// them on loopback without TLS (validated before).
func metricsOptions(m config.Metrics) metricsserver.Options {
	opts := metricsserver.Options{BindAddress: m.BindAddress}
	if config.Disabled(m.BindAddress) {
		opts.BindAddress = "0"
		return opts
	}
	if m.Secure {
		opts.SecureServing = true
		opts.FilterProvider = filters.WithAuthenticationAndAuthorization
		opts.CertDir = m.CertDir
		opts.TLSOpts = []func(*tls.Config){hardenTLS}
	}
	return opts
}

// hardenTLS requires TLS 1.2 and turns HTTP/2 off: HTTP/2 stream resets
// (CVE-2023-44487) cost servers more than they are worth here.
func hardenTLS(c *tls.Config) {
	c.MinVersion = tls.VersionTLS12
	c.NextProtos = []string{"http/1.1"}
}

// cachesSynced is a readiness check that passes once every informer the
// manager's cache has started (ControllerRings, Leases, ...) has synced.
func cachesSynced(c cache.Cache) healthz.Checker {
	return func(req *http.Request) error {
		ctx, cancel := context.WithTimeout(req.Context(), time.Second)
		defer cancel()
		if !c.WaitForCacheSync(ctx) {
			return errors.New("caches not synced yet")
		}
		return nil
	}
}

// cacheByObject returns the manager cache's per-type settings: each part
// contributes the selectors of the types it watches.
func cacheByObject() map[client.Object]cache.ByObject {
	byObject := map[client.Object]cache.ByObject{}
	maps.Copy(byObject, leasecontroller.CacheByObject())
	return byObject
}

// setupParts adds the sharder's parts to mgr: the lease controller, the
// assignment controller and the slot table controller (leader only) and the
// webhook (every replica).
// namespace is the namespace the sharder runs in.
func setupParts(mgr manager.Manager, cfg *config.Config, namespace string, leader *leaderLock) error {
	// One broadcaster of core/v1 Events for both controllers and the
	// leader election: unlike events.k8s.io series, it writes every
	// distinct message (see pkg/sharder/eventrecorder).
	recorder, err := eventrecorder.New(mgr, "sharder")
	if err != nil {
		return err
	}
	leader.setRecorder(recorder)
	registry := leasecontroller.NewRegistry()
	// A label write must end before the webhook call it waits for gives
	// up: under failure policy Ignore it would land unchecked after that.
	writeTimeout := min(membership.DefaultWriteTimeout, time.Duration(cfg.Webhook.TimeoutSeconds)*time.Second/2)
	// The identity the lease controller holds Leases as, and the slot table
	// controller fences them as.
	hostID, err := membership.DefaultIdentity()
	if err != nil {
		return fmt.Errorf("the sharder's Lease holder identity: %w", err)
	}
	identity := membership.SharderHolderPrefix + hostID
	lc, err := leasecontroller.New(leasecontroller.Options{
		Registry:      registry,
		Identity:      identity,
		Workers:       cfg.Controllers.Leases.Workers,
		WriteTimeout:  writeTimeout,
		EventRecorder: recorder,
	})
	if err != nil {
		return fmt.Errorf("creating the lease controller: %w", err)
	}
	if err := lc.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the lease controller: %w", err)
	}

	// The assignment and the webhook share their rings: the leader builds
	// each membership of a ring once, and derives the next ring from it.
	rings := &ringbuilds.Builds{Built: metrics.CountRingRebuild}
	resync := cfg.Controllers.Assignment.ResyncPeriod.Duration
	ac, err := assign.New(assign.Options{
		Registry:             registry,
		Workers:              cfg.Controllers.Assignment.Workers,
		ResyncPeriod:         &resync,
		NamespacedWatchLimit: namespacedWatchLimit(cfg.Controllers.Assignment.NamespacedWatchLimit),
		QPS:                  cfg.Client.QPS,
		Burst:                cfg.Client.Burst,
		EventRecorder:        recorder,
		FieldManager:         leader.fieldManager(),
		WriteTimeout:         writeTimeout,
		Rings:                rings,
	})
	if err != nil {
		return fmt.Errorf("creating the assignment controller: %w", err)
	}
	if err := ac.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the assignment controller: %w", err)
	}

	// The slot tables of the rings of unit Slots (docs/design.md §11),
	// decided from the lease controller's registry: it fences as the lease
	// controller's identity, and its table writes carry the label writes'
	// deadline, the lease controller's WriteTimeout.
	tc, err := slottable.New(slottable.Options{
		Registry:      registry,
		Identity:      identity,
		WriteTimeout:  writeTimeout,
		FieldManager:  leader.fieldManager(),
		EventRecorder: recorder,
	})
	if err != nil {
		return fmt.Errorf("creating the slot table controller: %w", err)
	}
	if err := tc.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the slot table controller: %w", err)
	}

	if !cfg.Webhook.Enabled {
		return nil
	}
	opts := webhook.FromConfig(cfg.Webhook, namespace)
	opts.LeaderLease = leader.key()
	opts.Rings = rings
	if err := webhook.Setup(mgr, opts); err != nil {
		return fmt.Errorf("setting up the webhook: %w", err)
	}
	return nil
}
