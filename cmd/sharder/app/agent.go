package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/pkg/instance/leaseholder"
	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/sharder/config"
)

// agentOptions are the flags of `sharder agent`.
type agentOptions struct {
	cluster   clusterFlags
	logging   config.Logging
	healthURL string
	// probeAddress serves /readyz (the Lease is held) and /healthz.
	probeAddress string
	holder       leaseholder.Options

	// Filled in by complete.
	client    client.Client
	logOutput io.Writer

	// stopping is set once SIGTERM arrived.
	stopping atomic.Bool
	// current is the holder of the moment (a new one after each loss).
	current atomic.Pointer[leaseholder.Holder]
}

// controllerPollInterval is how often the agent asks, after SIGTERM, whether
// the controller still runs.
const controllerPollInterval = 250 * time.Millisecond

// NewAgentCommand returns `sharder agent`.
func NewAgentCommand() *cobra.Command {
	o := &agentOptions{logging: config.Logging{Format: config.LogFormatJSON, Level: "info"}}
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Hold an instance Lease for a controller that cannot be changed (sidecar)",
		Long: `agent holds the instance Lease of the pod it runs in, for a controller that
cannot hold it itself (any language): it creates the Lease in the ring's lease
namespace and renews it while the controller's health endpoint answers. The
ring must be of unit Objects (spec.assignment.unit, the default): the agent
does not read the ring, and a controller it runs beside cannot follow slots.

On SIGTERM it keeps the Lease as long as the controller still runs, so that
the sharder moves nothing while a reconcile may be in flight: it goes on
renewing until the health endpoint refuses connections (the controller has
exited), then releases the Lease: with --release=Restart (a StatefulSet's pod,
which comes back with the same ID) the sharder keeps the instance's objects
for the ring's restartHold, waiting for the next pod; with --release=Stop (the
default) it moves them at once. If the controller still runs when --shutdown-timeout ends, or no
--health-url is given (the agent cannot tell when the controller stops), the
Lease is not released but left to expire: the sharder then moves the objects
two lease durations after the last renewal. Run the agent as a native sidecar
(an init container with restartPolicy: Always): Kubernetes stops it only after
the controller has exited.

The instance ID (the Lease's name) defaults to $POD_NAME, else the hostname.
With $POD_NAME and $POD_UID set from the downward API, the Lease is owned by
the pod and garbage collected with it.

When the agent cannot renew within its renew deadline (the API server is out
of reach, or the health endpoint fails), it logs that the Lease is lost and
tries to acquire it again. The controller next to it keeps running: it is up to
its health endpoint to tell. The agent cannot stop the controller or cancel its
reconciles, so it promises no bound on stopping (no sharder.dev/max-stop on the
Lease): a reconcile that runs on after the Lease is lost, beyond the Lease's
margin, or after a forced move, beyond the sharder's release grace, can meet the
next instance's. Bound the controller's reconciles with a timeout of its own.

With --health-probe-bind-address the agent answers /readyz with 200 only while
it holds the Lease (and /healthz while it runs). A readinessProbe on /readyz
keeps the pod unready until its instance holds the Lease, so that a rolling
update waits for each restarted pod to be an instance again before it stops
the next one.`,
		Example: `  sharder agent --ring etcd-operator --lease-namespace etcd-operator-system \
    --health-url http://localhost:8081/healthz`,
		Args: cobra.NoArgs,
		PreRunE: func(cmd *cobra.Command, _ []string) error {
			return o.complete(cmd.ErrOrStderr())
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd.Context())
		},
	}
	fs := cmd.Flags()
	o.cluster.addFlags(fs)
	fs.StringVar(&o.holder.Ring, "ring", "", "Name of the ControllerRing the instance belongs to. Required.")
	fs.StringVar(&o.holder.Namespace, "lease-namespace", "", "The ring's spec.leaseNamespace, where the Lease is held. Required.")
	fs.StringVar(&o.holder.Identity, "instance", "", "Instance ID: the Lease's name and holder. Default: $POD_NAME, else the hostname.")
	fs.DurationVar(&o.holder.LeaseDuration, "lease-duration", leaseholder.DefaultLeaseDuration, "How long the Lease is valid without renewal (whole seconds). The sharder moves the instance's objects about twice this long after the last renewal.")
	fs.DurationVar(&o.holder.RenewPeriod, "renew-period", 0, "Time between renewals. Default: a third of --lease-duration.")
	fs.DurationVar(&o.holder.RenewDeadline, "renew-deadline", 0, "How long after the start of its last successful renewal the agent gives the Lease up when it cannot renew; between --renew-period and --lease-duration. Default: two thirds of --lease-duration.")
	fs.StringVar((*string)(&o.holder.Release), "release", string(leaseholder.ReleaseStop), "How the Lease is handed back once the controller has stopped after SIGTERM: Restart (the pod comes back with the same ID, as a StatefulSet's pod: the sharder keeps its objects for the ring's restartHold, so a rolling update moves none) or Stop (its objects move at once).")
	fs.IntVar(&o.holder.VirtualNodes, "virtual-nodes", 0, "Weight of the instance in the ring (sharder.dev/virtual-nodes). Default: 0, the ring's default.")
	fs.StringVar(&o.healthURL, "health-url", "", "HTTP(S) URL of the controller's health endpoint; the Lease is acquired and renewed only while it answers 2xx, and after SIGTERM kept until it refuses connections. Default: none: renew unconditionally, and leave the Lease to expire after SIGTERM instead of releasing it.")
	fs.StringVar(&o.probeAddress, "health-probe-bind-address", "", "Address to serve /readyz (200 while the agent holds the Lease) and /healthz on, e.g. :8082. Default: none.")
	fs.DurationVar(&o.holder.ShutdownTimeout, "shutdown-timeout", leaseholder.DefaultShutdownTimeout, "How long after SIGTERM the agent keeps the Lease while the controller still runs; if it still runs then, the Lease is left to expire instead of released.")
	fs.StringVar(&o.logging.Format, "log-format", o.logging.Format, "Log format: json or console.")
	fs.StringVar(&o.logging.Level, "log-level", o.logging.Level, "Log level: debug, info, error, or a verbosity number.")
	return cmd
}

// complete validates the flags and builds the client.
func (o *agentOptions) complete(logOutput io.Writer) error {
	o.logOutput = logOutput
	if o.holder.Ring == "" {
		return errors.New("--ring is required")
	}
	if o.holder.Namespace == "" {
		return errors.New("--lease-namespace is required")
	}
	if _, err := o.logging.ZapLevel(); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	if o.logging.Format != config.LogFormatJSON && o.logging.Format != config.LogFormatConsole {
		return fmt.Errorf("--log-format %q: must be %s or %s", o.logging.Format, config.LogFormatJSON, config.LogFormatConsole)
	}
	if o.healthURL != "" {
		u, err := url.Parse(o.healthURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("--health-url %q: must be an absolute http or https URL", o.healthURL)
		}
		o.holder.Check = o.check
	}
	if o.holder.Identity == "" {
		id, err := membership.DefaultIdentity()
		if err != nil {
			return fmt.Errorf("--instance: %w", err)
		}
		o.holder.Identity = id
	}
	if err := leaseholder.ValidateIdentity(o.holder.Identity); err != nil {
		return fmt.Errorf("--instance (default $POD_NAME, else the hostname): %w", err)
	}
	if pod, uid := os.Getenv("POD_NAME"), os.Getenv("POD_UID"); pod != "" && uid != "" {
		o.holder.Pod = &metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: pod, UID: types.UID(uid)}
	}

	restConfig, err := o.cluster.restConfig()
	if err != nil {
		return err
	}
	o.client, err = client.NewWithWatch(restConfig, client.Options{Scheme: clientgoscheme.Scheme})
	if err != nil {
		return fmt.Errorf("creating the client: %w", err)
	}
	// Check the holder's options now, so that mistakes fail before the start.
	if _, err := leaseholder.NewHolder(o.client, o.holder); err != nil {
		return err
	}
	return nil
}

// run holds the Lease until ctx ends, acquiring it again after a loss.
func (o *agentOptions) run(ctx context.Context) error {
	log, err := newLogger(o.logging, o.logOutput)
	if err != nil {
		return err
	}
	setProcessLoggers(log)
	log = log.WithValues("lease", klog.KRef(o.holder.Namespace, o.holder.Identity), "ring", o.holder.Ring)
	ctx = logr.NewContext(ctx, log)
	log.Info("Starting the lease agent", "version", Version(), "leaseDuration", o.holder.LeaseDuration, "healthURL", o.healthURL)
	if o.probeAddress != "" {
		stop, err := o.serveProbes(ctx, log)
		if err != nil {
			return err
		}
		defer stop()
	}

	for {
		opts := o.holder
		// The holder logs the loss; the loop below acquires the Lease again.
		opts.OnLost = func() {}
		opts.BeforeRelease = o.waitForController
		holder, err := leaseholder.NewHolder(o.client, opts)
		if err != nil {
			return err
		}
		o.current.Store(holder)
		err = holder.Start(ctx)
		switch {
		case err == nil:
			log.Info("Lease agent stopped")
			return nil
		case errors.Is(err, leaseholder.ErrLeaseLost) && ctx.Err() == nil:
			log.Info("Acquiring the instance Lease again")
		default:
			return err
		}
	}
}

// check is the holder's condition for writing the Lease: before SIGTERM,
// a healthy controller; after it, a controller that still runs, healthy or
// not, since it may still be reconciling.
func (o *agentOptions) check(ctx context.Context) error {
	if !o.stopping.Load() {
		return o.checkHealth(ctx)
	}
	if o.controllerGone(ctx) {
		return fmt.Errorf("the controller has stopped: %s refuses connections", o.healthURL)
	}
	return nil
}

// waitForController is the holder's BeforeRelease: it returns nil once the
// controller has stopped, so that the Lease is released, and an error (the
// Lease is left to expire) when the controller still runs at the end of ctx
// or when there is no health endpoint to tell.
func (o *agentOptions) waitForController(ctx context.Context) error {
	o.stopping.Store(true)
	if o.healthURL == "" {
		return errors.New("without --health-url the agent cannot tell whether the controller has stopped")
	}
	log := logr.FromContextOrDiscard(ctx)
	log.Info("Keeping the instance Lease until the controller has stopped", "healthURL", o.healthURL, "timeout", o.holder.ShutdownTimeout)
	err := wait.PollUntilContextCancel(ctx, controllerPollInterval, true, func(ctx context.Context) (bool, error) {
		return o.controllerGone(ctx), nil
	})
	if err != nil {
		return fmt.Errorf("the controller still answers on %s at the end of the shutdown timeout", o.healthURL)
	}
	log.Info("The controller has stopped")
	return nil
}

// controllerGone reports whether nothing listens at the health endpoint any
// more: the controller has exited (or closed its health server, which must
// then outlive its last reconcile). Any answer, a timeout or another error
// means it may still run.
func (o *agentOptions) controllerGone(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, o.healthURL, nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return errors.Is(err, syscall.ECONNREFUSED)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	_ = resp.Body.Close()
	return false
}

// checkHealth asks the controller's health endpoint; an answer other than
// 2xx, or none, is an error.
func (o *agentOptions) checkHealth(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, o.healthURL, nil)
	if err != nil {
		return fmt.Errorf("health request: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("health endpoint %s: %w", o.healthURL, err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	_ = resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("health endpoint %s answered %s", o.healthURL, resp.Status)
	}
	return nil
}

// serveProbes serves /readyz (200 while the current holder holds the Lease)
// and /healthz on o.probeAddress until the returned stop is called.
func (o *agentOptions) serveProbes(ctx context.Context, log logr.Logger) (stop func(), err error) {
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", o.probeAddress)
	if err != nil {
		return nil, fmt.Errorf("--health-probe-bind-address: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if h := o.current.Load(); h == nil || !h.Held() {
			http.Error(w, "the instance Lease is not held", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok")
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error(err, "Serving the probes")
		}
	}()
	log.Info("Serving the probes", "address", ln.Addr().String())
	return func() { _ = srv.Close() }, nil
}
