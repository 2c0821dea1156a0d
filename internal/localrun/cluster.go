package localrun

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// SharderUserName is the user name the sharder authenticates as. Its
// group system:masters grants every permission under RBAC.
const SharderUserName = "sharder"

// ClusterOptions configures NewCluster.
type ClusterOptions struct {
	// Dir receives kubeconfigs, binaries and logs. Required.
	Dir string
	// CRDs are installed at start. Default: DefaultCRDs().
	CRDs []string
	// Operator builds the example operator too. Default: false.
	Operator bool
	// PlainController builds the plain controller too. Default: false.
	PlainController bool
	// Scheme of the admin client. Default: Scheme().
	Scheme *runtime.Scheme
	// APIServerFlags and EtcdFlags are added to kube-apiserver's and etcd's
	// command lines (testenv.Options). Default: none.
	APIServerFlags, EtcdFlags map[string]string
}

// Cluster is a local control plane with the sharder's binaries and the
// processes a run started.
type Cluster struct {
	// Dir holds everything of the run.
	Dir string
	// LogDir holds the processes' logs.
	LogDir string
	// ControlPlane is the running etcd and kube-apiserver.
	ControlPlane *ControlPlane
	// Binaries are the built programs.
	Binaries Binaries
	// SharderUser is the sharder's identity.
	SharderUser *User
	// Processes are the processes started on this cluster.
	Processes Processes
	// Webhook stands in for the Service in front of the sharder replicas'
	// webhook servers: the API server calls https://<its address>.
	Webhook *Balancer
}

// NewCluster builds the binaries and starts the control plane. Call Stop
// when done.
func NewCluster(opts ClusterOptions) (*Cluster, error) {
	if opts.Dir == "" {
		return nil, fmt.Errorf("cluster: Dir is required")
	}
	if opts.CRDs == nil {
		opts.CRDs = DefaultCRDs()
	}
	c := &Cluster{Dir: opts.Dir, LogDir: filepath.Join(opts.Dir, "logs")}
	var err error
	if c.Binaries, err = Build(BuildOptions{Dir: filepath.Join(opts.Dir, "bin"), Operator: opts.Operator, PlainController: opts.PlainController}); err != nil {
		return nil, err
	}
	if c.ControlPlane, err = StartControlPlane(ControlPlaneOptions{Dir: filepath.Join(opts.Dir, "kubeconfigs"), CRDs: opts.CRDs, Scheme: opts.Scheme,
		APIServerFlags: opts.APIServerFlags, EtcdFlags: opts.EtcdFlags}); err != nil {
		return nil, err
	}
	if c.SharderUser, err = c.ControlPlane.AddUser("sharder", SharderUserName, "system:masters"); err != nil {
		_ = c.ControlPlane.Stop()
		return nil, err
	}
	if c.Webhook, err = NewBalancer(); err != nil {
		_ = c.ControlPlane.Stop()
		return nil, err
	}
	return c, nil
}

// Client returns the admin client.
func (c *Cluster) Client() client.Client { return c.ControlPlane.Client }

// Stop kills every process of the run and stops the control plane.
func (c *Cluster) Stop() error {
	if c == nil {
		return nil
	}
	c.Processes.KillAll()
	if c.Webhook != nil {
		_ = c.Webhook.Close()
	}
	return c.ControlPlane.Stop()
}

// DumpLogs writes the logs of every process of the run to w.
func (c *Cluster) DumpLogs(w io.Writer) { c.Processes.DumpLogs(w) }

// Start starts a process whose log goes into the run's log folder and
// tracks it.
func (c *Cluster) Start(opts ProcessOptions) (*Process, error) {
	if opts.LogDir == "" {
		opts.LogDir = c.LogDir
	}
	p, err := StartProcess(opts)
	if err != nil {
		return nil, err
	}
	c.Processes.Add(p)
	return p, nil
}

// EnsureNamespace creates namespace name unless it exists.
func EnsureNamespace(ctx context.Context, c client.Client, name string) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := c.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", name, err)
	}
	return nil
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	l, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// FreeAddress returns 127.0.0.1:<free port>.
func FreeAddress() (string, error) {
	p, err := FreePort()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(p)), nil
}

// TempDir creates a folder for a run that is not a test (demo, bench),
// under dir when given.
func TempDir(dir, pattern string) (string, error) {
	if dir != "" {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return "", err
		}
	}
	return os.MkdirTemp(dir, pattern)
}

// SharderOptions configures one sharder replica.
type SharderOptions struct {
	// Name of the process, e.g. sharder-0. Required.
	Name string
	// Namespace holds the leader election Lease and the webhook Secret.
	// Default: sharder-system.
	Namespace string
	// LeaderLeaseDuration is the leader election Lease duration; renew
	// deadline and retry period follow from it. Default: 4s.
	LeaderLeaseDuration time.Duration
	// Kubeconfig is the identity the replica runs as. Default: the
	// cluster's SharderUser (a member of system:masters, which API Priority
	// and Fairness exempts).
	Kubeconfig string
	// Args are added to the command line. Default: none.
	Args []string
	// Env is added to the process's environment (e.g. GOGC). Default: none.
	Env []string
	// Restart restarts the replica when it exits on its own (one that lost
	// its leadership exits on purpose), as the kubelet restarts the
	// sharder's container. Default: none, an exit is final.
	Restart *RestartPolicy
}

// Sharder is a running sharder replica.
type Sharder struct {
	*Process
	// HealthAddress serves /healthz and /readyz.
	HealthAddress string
	// MetricsAddress serves /metrics over plain HTTP on loopback.
	MetricsAddress string
	// WebhookPort is the webhook server's port on 127.0.0.1.
	WebhookPort int
}

// StartSharder starts a sharder replica as the sharder user, with leader
// election, its webhook on a free loopback port and short timings.
func (c *Cluster) StartSharder(ctx context.Context, opts SharderOptions) (*Sharder, error) {
	s, cmd, err := c.PrepareSharder(ctx, opts)
	if err != nil {
		return nil, err
	}
	p, err := c.Start(ProcessOptions{Name: opts.Name, Path: c.Binaries.Sharder, Args: cmd.Args, Env: cmd.Env, Restart: opts.Restart})
	if err != nil {
		return nil, err
	}
	s.Process = p
	c.Webhook.AddBackend(net.JoinHostPort("127.0.0.1", strconv.Itoa(s.WebhookPort)))
	return s, nil
}

// SharderCommand is the command line and environment of a sharder replica.
type SharderCommand struct {
	// Args are the arguments of the sharder binary, starting with "run".
	Args []string
	// Env holds the variables added to the environment.
	Env []string
}

// PrepareSharder picks the addresses of a sharder replica and returns its
// command line, without starting it: StartSharder runs it as a process;
// a caller may run it in its own process instead (then it adds the webhook
// port to c.Webhook itself). The returned Sharder has no Process.
func (c *Cluster) PrepareSharder(ctx context.Context, opts SharderOptions) (*Sharder, SharderCommand, error) {
	if opts.Namespace == "" {
		opts.Namespace = "sharder-system"
	}
	if opts.LeaderLeaseDuration == 0 {
		opts.LeaderLeaseDuration = 4 * time.Second
	}
	if opts.Kubeconfig == "" {
		opts.Kubeconfig = c.SharderUser.Kubeconfig
	}
	if err := EnsureNamespace(ctx, c.Client(), opts.Namespace); err != nil {
		return nil, SharderCommand{}, err
	}
	s := &Sharder{}
	var err error
	if s.HealthAddress, err = FreeAddress(); err != nil {
		return nil, SharderCommand{}, err
	}
	if s.MetricsAddress, err = FreeAddress(); err != nil {
		return nil, SharderCommand{}, err
	}
	if s.WebhookPort, err = FreePort(); err != nil {
		return nil, SharderCommand{}, err
	}
	d := opts.LeaderLeaseDuration
	args := make([]string, 0, 32+len(opts.Args))
	args = append(args, "run",
		"--kubeconfig", opts.Kubeconfig,
		"--leader-elect=true",
		"--leader-election-namespace", opts.Namespace,
		"--leader-election-lease-duration", d.String(),
		"--leader-election-renew-deadline", (d * 3 / 4).String(),
		"--leader-election-retry-period", (d / 8).String(),
		"--webhook-port", strconv.Itoa(s.WebhookPort),
		"--webhook-cert-dir", filepath.Join(c.Dir, opts.Name, "webhook-certs"),
		"--webhook-url", "https://"+c.Webhook.Address(),
		"--metrics-bind-address", s.MetricsAddress,
		"--metrics-secure=false",
		"--health-probe-bind-address", s.HealthAddress,
		"--log-format", "console",
		"--shutdown-timeout", "10s",
	)
	args = append(args, opts.Args...)
	env := append([]string{"POD_NAMESPACE=" + opts.Namespace, "POD_NAME=" + opts.Name}, opts.Env...)
	return s, SharderCommand{Args: args, Env: env}, nil
}

// leaderMessage is what client-go's leader election logs once a replica
// leads.
const leaderMessage = "successfully acquired lease"

// IsLeader reports whether the replica runs and its current run has become
// the leader. A replica that loses its leadership exits (and may be
// restarted), so a run that once acquired the lease still leads.
func IsLeader(s *Sharder) bool {
	return s.Running() && strings.Contains(strings.ToLower(s.CurrentLogs()), leaderMessage)
}
