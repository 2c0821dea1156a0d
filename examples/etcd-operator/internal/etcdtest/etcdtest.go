// Package etcdtest runs real etcd clusters as local processes for tests: the
// etcd binary the project builds for its test control plane, members on
// 127.0.0.1 with ports the kernel hands out. Start bootstraps a cluster;
// New, Add and StartMember let a test start members itself, as an
// operator's pods would (joining an existing cluster), and StopMember,
// RestartMember and Wipe stop one, start it again and remove its data.
package etcdtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sharder-dev/sharder/internal/testenv"
)

// Options configure a cluster's members. The zero value is plain HTTP.
type Options struct {
	// ServerDir, when set, holds tls.crt, tls.key and ca.crt (a
	// certificate Secret's keys as files): members serve clients and peers
	// over TLS with it, require client certificates the CA signed, and
	// serve /health over plain HTTP on a metrics URL.
	ServerDir string
	// PeerDir, when set with ServerDir, holds the tls.crt and tls.key
	// members present to each other.
	PeerDir string
}

// Cluster is a local etcd cluster. Its members stop when the test ends.
type Cluster struct {
	t      testing.TB
	binary string
	token  string
	dir    string
	opts   Options
	// mu guards members, which Add extends.
	mu      sync.Mutex
	members []*Member
	// ending is set when the test's cleanup stops the members: an exit
	// then is no failed start to try again.
	ending atomic.Bool
}

// Member is one etcd process of a Cluster.
type Member struct {
	Name      string
	ClientURL string
	PeerURL   string
	// MetricsURL serves /health over plain HTTP; set with Options.ServerDir.
	MetricsURL string
	dataDir    string
	logPath    string
	// initialCluster and state are the bootstrap flags it starts with.
	initialCluster, state string

	mu  sync.Mutex
	cmd *exec.Cmd
	// done is closed when the process exits.
	done chan struct{}
}

// Start starts a cluster of the named members (one per name) and waits
// until each answers /health. It fails the test if it cannot.
func Start(t testing.TB, names ...string) *Cluster {
	t.Helper()
	c, err := StartContext(context.Background(), t, names...)
	if err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	return c
}

// StartContext is Start returning the error instead of failing the test,
// for callers outside the test's goroutine; it gives up waiting for the
// members when ctx ends. The members stop when the test ends either way.
func StartContext(ctx context.Context, t testing.TB, names ...string) (*Cluster, error) {
	return StartWith(ctx, t, Options{}, names...)
}

// StartWith is StartContext with options.
func StartWith(ctx context.Context, t testing.TB, opts Options, names ...string) (*Cluster, error) {
	assets, err := testenv.AssetsDir()
	if err != nil {
		return nil, err
	}
	binary := filepath.Join(assets, "etcd")
	var lastErr error
	for range startAttempts {
		c, err := start(ctx, t, binary, opts, names)
		if err == nil {
			return c, nil
		}
		lastErr = err
		if !errors.Is(err, errExited) || ctx.Err() != nil {
			break
		}
	}
	return nil, lastErr
}

// startAttempts is how often StartContext starts a cluster whose member
// exits before it is healthy. The ports are free when chosen but not
// reserved: another process (an outgoing connection's ephemeral port, the
// tests of other packages) may take one before etcd listens on it, and etcd
// then exits. Each attempt chooses new ports.
const startAttempts = 3

// ErrTestEnded reports a start that the test's end cut short: its cleanup
// stopped the members (or found them not started yet).
var ErrTestEnded = errors.New("the test ended before the cluster was healthy")

// errExited reports a member that exited before it answered /health.
var errExited = errors.New("exited before it was healthy")

// start makes one attempt of StartContext; on failure the members it
// started are stopped.
func start(ctx context.Context, t testing.TB, binary string, opts Options, names []string) (*Cluster, error) {
	c := newCluster(t, binary)
	c.opts = opts
	for _, name := range names {
		if _, err := c.Add(name); err != nil {
			return nil, err
		}
	}
	peers := make([]string, len(c.members))
	for i, p := range c.members {
		peers[i] = p.Name + "=" + p.PeerURL
	}
	stopAll := func() {
		for _, m := range c.Members() {
			m.stop()
		}
	}
	for _, m := range c.members {
		m.initialCluster, m.state = strings.Join(peers, ","), "new"
		if err := c.start(m); err != nil {
			stopAll()
			return nil, err
		}
	}
	for _, m := range c.members {
		if err := c.waitHealthy(ctx, m); err != nil {
			stopAll()
			return nil, err
		}
	}
	return c, nil
}

func newCluster(t testing.TB, binary string) *Cluster {
	c := &Cluster{t: t, binary: binary, token: fmt.Sprintf("etcdtest-%d", time.Now().UnixNano()), dir: t.TempDir()}
	t.Cleanup(func() {
		c.ending.Store(true)
		for _, m := range c.Members() {
			m.stop()
		}
	})
	return c
}

// New returns a cluster without members, for a test that adds and starts
// them itself (Add, StartMember), as an operator's pods would.
func New(t testing.TB) *Cluster {
	t.Helper()
	assets, err := testenv.AssetsDir()
	if err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	return newCluster(t, filepath.Join(assets, "etcd"))
}

// Add gives the cluster a member named name, with addresses of its own, and
// returns it without starting it: its peer URL is known before it runs, so
// it can be added to etcd first (as a learner) and started to join.
func (c *Cluster) Add(name string) (*Member, error) {
	client, err := freeAddr()
	if err != nil {
		return nil, err
	}
	peer, err := freeAddr()
	if err != nil {
		return nil, err
	}
	scheme := "http"
	if c.opts.ServerDir != "" {
		scheme = "https"
	}
	m := &Member{
		Name:      name,
		ClientURL: scheme + "://" + client,
		PeerURL:   scheme + "://" + peer,
		dataDir:   filepath.Join(c.dir, name),
		logPath:   filepath.Join(c.dir, name+".log"),
	}
	if c.opts.ServerDir != "" {
		metrics, err := freeAddr()
		if err != nil {
			return nil, err
		}
		m.MetricsURL = "http://" + metrics
	}
	c.mu.Lock()
	c.members = append(c.members, m)
	c.mu.Unlock()
	return m, nil
}

// Member returns the member named name, nil if there is none.
func (c *Cluster) Member(name string) *Member {
	for _, m := range c.Members() {
		if m.Name == name {
			return m
		}
	}
	return nil
}

// Members returns the cluster's members, in the order they were added.
func (c *Cluster) Members() []*Member {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.members)
}

// ClientURLs returns every member's client URL.
func (c *Cluster) ClientURLs() []string {
	members := c.Members()
	out := make([]string, len(members))
	for i, m := range members {
		out[i] = m.ClientURL
	}
	return out
}

// StartMember starts m with the given initial cluster and state ("new" or
// "existing"; etcd uses them only while m has no data) and returns without
// waiting for it to be healthy (Healthy waits).
func (c *Cluster) StartMember(m *Member, initialCluster, state string) error {
	m.mu.Lock()
	m.initialCluster, m.state = initialCluster, state
	m.mu.Unlock()
	return c.start(m)
}

// RestartMember starts m again, after StopMember, with the flags it last
// started with, and returns without waiting for it to be healthy.
func (c *Cluster) RestartMember(m *Member) error { return c.start(m) }

// StopMember stops m (SIGTERM) and waits for it to exit.
func (c *Cluster) StopMember(m *Member) { m.stop() }

// Wipe deletes m's data, as a pod with ephemeral storage loses it; m must
// be stopped.
func (c *Cluster) Wipe(m *Member) error {
	if m.Running() {
		return fmt.Errorf("etcdtest: wiping %s, which runs", m.Name)
	}
	return os.RemoveAll(m.dataDir)
}

// LogTail returns the last n bytes of m's log (its output since it was
// first started), for a failing test to show.
func (m *Member) LogTail(n int) string {
	out, err := os.ReadFile(m.logPath)
	if err != nil {
		return err.Error()
	}
	if len(out) > n {
		out = out[len(out)-n:]
	}
	return string(out)
}

// Running reports whether m's process runs.
func (m *Member) Running() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil {
		return false
	}
	select {
	case <-m.done:
		return false
	default:
		return true
	}
}

// Healthy waits up to a minute, or until ctx ends, for m to answer /health
// with 200, and returns why it did not.
func (c *Cluster) Healthy(ctx context.Context, m *Member) error { return c.waitHealthy(ctx, m) }

// Stop stops member i (SIGTERM) and waits for it to exit.
func (c *Cluster) Stop(i int) { c.Members()[i].stop() }

// Restart starts member i again on its data, after Stop, and waits until it
// answers /health.
func (c *Cluster) Restart(i int) {
	c.t.Helper()
	m := c.Members()[i]
	if err := c.start(m); err != nil {
		c.t.Fatalf("etcdtest: %v", err)
	}
	c.WaitHealthy(m)
}

func (c *Cluster) start(m *Member) error {
	m.mu.Lock()
	initialCluster, state := m.initialCluster, m.state
	m.mu.Unlock()
	log, err := os.OpenFile(m.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer func() { _ = log.Close() }()
	args := []string{
		"--name=" + m.Name,
		"--data-dir=" + m.dataDir,
		"--listen-client-urls=" + m.ClientURL,
		"--advertise-client-urls=" + m.ClientURL,
		"--listen-peer-urls=" + m.PeerURL,
		"--initial-advertise-peer-urls=" + m.PeerURL,
		"--initial-cluster=" + initialCluster,
		"--initial-cluster-state=" + state,
		"--initial-cluster-token=" + c.token,
		"--heartbeat-interval=50",
		"--election-timeout=500",
		"--unsafe-no-fsync",
		"--log-level=warn",
	}
	if dir := c.opts.ServerDir; dir != "" {
		args = append(args,
			"--cert-file="+filepath.Join(dir, "tls.crt"), "--key-file="+filepath.Join(dir, "tls.key"),
			"--trusted-ca-file="+filepath.Join(dir, "ca.crt"), "--client-cert-auth",
			"--peer-cert-file="+filepath.Join(dir, "tls.crt"), "--peer-key-file="+filepath.Join(dir, "tls.key"),
			"--peer-trusted-ca-file="+filepath.Join(dir, "ca.crt"), "--peer-client-cert-auth",
			"--listen-metrics-urls="+m.MetricsURL,
		)
		if peer := c.opts.PeerDir; peer != "" {
			args = append(args, "--peer-client-cert-file="+filepath.Join(peer, "tls.crt"), "--peer-client-key-file="+filepath.Join(peer, "tls.key"))
		}
	}
	cmd := exec.CommandContext(context.Background(), c.binary, args...) //nolint:gosec // the etcd built for the test control plane
	cmd.Stdout, cmd.Stderr = log, log
	// Under the member's lock, so that the test's cleanup, which sets
	// ending and then stops each member under its lock, either stops this
	// process or finds it never started.
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd != nil {
		select {
		case <-m.done:
		default:
			return fmt.Errorf("not starting %s: it runs", m.Name)
		}
	}
	if c.ending.Load() {
		return fmt.Errorf("not starting %s: %w", m.Name, ErrTestEnded)
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", m.Name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	m.cmd, m.done = cmd, done
	return nil
}

func (m *Member) stop() {
	m.mu.Lock()
	cmd, done := m.cmd, m.done
	m.cmd = nil
	m.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(os.Interrupt)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// WaitHealthy waits up to a minute for m to answer /health with 200 (it has
// a leader), failing the test with the end of its log if it does not.
func (c *Cluster) WaitHealthy(m *Member) {
	c.t.Helper()
	if err := c.waitHealthy(context.Background(), m); err != nil {
		c.t.Fatalf("etcdtest: %v", err)
	}
}

func (c *Cluster) waitHealthy(ctx context.Context, m *Member) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	client := &http.Client{Timeout: 2 * time.Second}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		health := m.ClientURL + "/health"
		if m.MetricsURL != "" {
			health = m.MetricsURL + "/health"
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, health, nil)
		if err != nil {
			return err
		}
		if resp, err := client.Do(req); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		m.mu.Lock()
		done := m.done
		m.mu.Unlock()
		select {
		case <-done:
			if c.ending.Load() {
				return fmt.Errorf("%s: %w", m.Name, ErrTestEnded)
			}
			out, _ := os.ReadFile(m.logPath)
			if len(out) > 4000 {
				out = out[len(out)-4000:]
			}
			return fmt.Errorf("%s (%s) %w:\n%s", m.Name, m.ClientURL, errExited, out)
		case <-ctx.Done():
			out, _ := os.ReadFile(m.logPath)
			if len(out) > 4000 {
				out = out[len(out)-4000:]
			}
			state := "running"
			m.mu.Lock()
			if m.cmd == nil {
				state = "stopped"
			} else {
				select {
				case <-m.done:
					state = "exited: " + m.cmd.ProcessState.String()
				default:
				}
			}
			m.mu.Unlock()
			return fmt.Errorf("%s (%s, %s) did not become healthy:\n%s", m.Name, m.ClientURL, state, out)
		case <-tick.C:
		}
	}
}

// freeAddr returns a 127.0.0.1 address with a port nothing listens on.
func freeAddr() (string, error) {
	var lc net.ListenConfig
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer func() { _ = l.Close() }()
	return l.Addr().String(), nil
}
