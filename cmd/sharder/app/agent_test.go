package app

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
)

// agentLogs is a bytes.Buffer safe for the command's concurrent log writes.
type agentLogs struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *agentLogs) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *agentLogs) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// agentNamespace creates a namespace for the test and deletes it after.
func agentNamespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "agent-"}}
	NewWithT(t).Expect(env().Client.Create(context.Background(), ns)).To(Succeed())
	t.Cleanup(func() { _ = env().Client.Delete(context.Background(), ns) })
	return ns.Name
}

// agentKubeconfig writes the test control plane's kubeconfig.
func agentKubeconfig(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	NewWithT(t).Expect(env().WriteKubeConfig(path)).To(Succeed())
	return path
}

// runAgent runs `sharder agent args...` in-process until the returned cancel
// is called (as the signal handler does on SIGTERM).
func startAgent(t *testing.T, args ...string) (cancel context.CancelFunc, done chan error, logs *agentLogs) {
	t.Helper()
	cmd := NewAgentCommand()
	logs = &agentLogs{}
	cmd.SetArgs(args)
	cmd.SetOut(logs)
	cmd.SetErr(logs)
	ctx, cancel := context.WithCancel(context.Background())
	done = make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Logf("agent: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("the agent did not stop")
		}
	})
	return cancel, done, logs
}

func agentLease(namespace, name string) func() (*coordinationv1.Lease, error) {
	return func() (*coordinationv1.Lease, error) {
		lease := &coordinationv1.Lease{}
		err := env().Client.Get(context.Background(), client.ObjectKey{Namespace: namespace, Name: name}, lease)
		return lease, err
	}
}

// leaseState returns the state the sharder would compute for the Lease now.
func agentLeaseState(namespace, name string) func() (membership.State, error) {
	return func() (membership.State, error) {
		lease, err := agentLease(namespace, name)()
		if err != nil {
			return "", err
		}
		state, _ := membership.StateOf(lease, time.Now())
		return state, nil
	}
}

// expectRenewing checks that the agent keeps holding the Lease for the
// whole of period and renews it meanwhile. It asserts what the agent does
// (hold and renew), not the state a sharder would compute from the
// renewals' timing, which a loaded machine can delay past a one-second
// lease duration.
func expectRenewing(g Gomega, ns, name string, period time.Duration, logs *agentLogs) {
	before, err := agentLease(ns, name)()
	g.Expect(err).NotTo(HaveOccurred())
	g.Consistently(agentLease(ns, name), period, 50*time.Millisecond).Should(
		HaveField("Spec.HolderIdentity", HaveValue(Equal(name))), "logs:\n%s", logs)
	after, err := agentLease(ns, name)()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(after.Spec.RenewTime.Time).To(BeTemporally(">", before.Spec.RenewTime.Time), "not renewed for %v; logs:\n%s", period, logs)
}

// waitHeld waits until the agent knows it holds its Lease: the Lease is
// ready as soon as the agent's write lands, a moment before the agent has
// read the answer, and an agent stopped in that moment is still acquiring
// (it neither renews through its shutdown nor says why it does not
// release).
func waitHeld(g Gomega, logs *agentLogs) { waitAcquired(g, logs, 1) }

// waitAcquired waits until the agent has logged its n-th acquisition of
// its Lease (see waitHeld).
func waitAcquired(g Gomega, logs *agentLogs, n int) {
	g.Eventually(func() int { return strings.Count(logs.String(), "Acquired the instance Lease") }, 10*time.Second, 20*time.Millisecond).
		Should(BeNumerically(">=", n), "logs:\n%s", logs)
}

// TestAgent runs the agent against the test API server with a health
// endpoint that fails and recovers, then stops it as SIGTERM would.
func TestAgent(t *testing.T) {
	g := NewWithT(t)
	ns := agentNamespace(t)
	t.Setenv("POD_NAME", "worker-0")
	t.Setenv("POD_UID", "0d5f1c2a-0000-4000-8000-000000000001")

	var status atomic.Int32
	status.Store(http.StatusServiceUnavailable)
	health := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(int(status.Load()))
	}))
	defer health.Close()

	probes := freeAddress(t)
	cancel, done, logs := startAgent(t,
		"--kubeconfig", agentKubeconfig(t),
		"--ring", "workers", "--lease-namespace", ns,
		// 2 s: a loaded machine may answer a few renewals late without the
		// agent losing its Lease.
		"--lease-duration", "2s", "--renew-period", "200ms", "--virtual-nodes", "64",
		"--health-url", health.URL, "--health-probe-bind-address", probes,
	)
	probe := func(path string) func() (int, error) {
		return func() (int, error) {
			resp, err := http.Get("http://" + probes + path)
			if err != nil {
				return 0, err
			}
			defer resp.Body.Close()
			return resp.StatusCode, nil
		}
	}

	// Unhealthy from the start: no Lease, not ready.
	g.Consistently(func() bool {
		_, err := agentLease(ns, "worker-0")()
		return apierrors.IsNotFound(err)
	}, time.Second, 50*time.Millisecond).Should(BeTrue(), "logs:\n%s", logs)
	g.Eventually(probe("/healthz"), 5*time.Second, 20*time.Millisecond).Should(Equal(http.StatusOK))
	g.Expect(probe("/readyz")()).To(Equal(http.StatusServiceUnavailable))

	// Healthy: the Lease is created for the pod's instance ID.
	status.Store(http.StatusOK)
	g.Eventually(agentLeaseState(ns, "worker-0"), 10*time.Second, 20*time.Millisecond).Should(Equal(membership.StateReady), "logs:\n%s", logs)
	lease, err := agentLease(ns, "worker-0")()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(lease.Spec.HolderIdentity).To(HaveValue(Equal("worker-0")))
	g.Expect(lease.Spec.LeaseDurationSeconds).To(HaveValue(BeEquivalentTo(2)))
	g.Expect(lease.Labels).To(Equal(map[string]string{v1alpha1.LabelRing: "workers", v1alpha1.LabelVirtualNodes: "64"}))
	g.Expect(lease.OwnerReferences).To(ConsistOf(HaveField("UID", BeEquivalentTo("0d5f1c2a-0000-4000-8000-000000000001"))))
	g.Expect(lease.OwnerReferences[0].Kind).To(Equal("Pod"))
	g.Expect(lease.OwnerReferences[0].Name).To(Equal("worker-0"))
	g.Eventually(probe("/readyz"), 5*time.Second, 20*time.Millisecond).Should(Equal(http.StatusOK), "ready while it holds the Lease")
	// Renewed while healthy: ready past its first lease duration.
	expectRenewing(g, ns, "worker-0", 2500*time.Millisecond, logs)

	// Unhealthy: renewals stop, the Lease expires, the agent is not ready.
	status.Store(http.StatusInternalServerError)
	g.Eventually(agentLeaseState(ns, "worker-0"), 5*time.Second, 20*time.Millisecond).Should(Equal(membership.StateExpired))
	g.Eventually(probe("/readyz"), 5*time.Second, 20*time.Millisecond).Should(Equal(http.StatusServiceUnavailable))

	// Healthy again: the agent acquires the Lease again, once it has
	// watched it unrenewed for its duration.
	status.Store(http.StatusNoContent)
	g.Eventually(agentLeaseState(ns, "worker-0"), 10*time.Second, 20*time.Millisecond).Should(Equal(membership.StateReady), "logs:\n%s", logs)
	waitAcquired(g, logs, 2)

	// SIGTERM while the controller still runs, failing its health check as
	// it shuts down: the agent keeps renewing, since the controller may
	// still be reconciling.
	cancel()
	status.Store(http.StatusServiceUnavailable)
	expectRenewing(g, ns, "worker-0", 2*time.Second, logs)
	g.Expect(done).NotTo(Receive())

	// The controller exits (nothing listens any more): the Lease is
	// released and the command returns.
	health.Close()
	g.Eventually(done, 10*time.Second).Should(Receive(BeNil()))
	done <- nil // for the cleanup
	g.Expect(agentLease(ns, "worker-0")()).To(HaveField("Spec.HolderIdentity", HaveValue(BeEmpty())))
	g.Expect(agentLeaseState(ns, "worker-0")()).To(Equal(membership.StateDead))
	g.Expect(logs.String()).To(ContainSubstring("Released the instance Lease"))
}

// TestAgentControllerOutlivesShutdown: when the controller still answers
// at the end of the agent's shutdown timeout, the Lease is not released
// but left to expire, so that the sharder waits before moving anything.
func TestAgentControllerOutlivesShutdown(t *testing.T) {
	g := NewWithT(t)
	ns := agentNamespace(t)
	health := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
	}))
	defer health.Close()
	cancel, done, logs := startAgent(t,
		"--kubeconfig", agentKubeconfig(t),
		"--ring", "workers", "--lease-namespace", ns, "--instance", "worker-1",
		"--lease-duration", "2s", "--renew-period", "200ms", "--shutdown-timeout", "3s",
		"--health-url", health.URL,
	)
	g.Eventually(agentLeaseState(ns, "worker-1"), 10*time.Second, 20*time.Millisecond).Should(Equal(membership.StateReady), "logs:\n%s", logs)
	waitHeld(g, logs)

	cancel()
	// Renewed through the shutdown timeout (longer than the lease duration).
	expectRenewing(g, ns, "worker-1", 2500*time.Millisecond, logs)
	g.Eventually(done, 10*time.Second).Should(Receive(BeNil()))
	done <- nil
	lease, err := agentLease(ns, "worker-1")()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(lease.Spec.HolderIdentity).To(HaveValue(Equal("worker-1")), "not released")
	g.Expect(logs.String()).To(ContainSubstring("Not releasing the instance Lease"))
	g.Expect(logs.String()).NotTo(ContainSubstring("Released the instance Lease"))
	// No longer renewed: it expires (and, a lease duration later, becomes uncertain).
	g.Eventually(agentLeaseState(ns, "worker-1"), 10*time.Second, 20*time.Millisecond).Should(BeElementOf(membership.StateExpired, membership.StateUncertain))
}

// TestAgentInstanceFlag checks --instance and an agent without health URL.
func TestAgentInstanceFlag(t *testing.T) {
	g := NewWithT(t)
	ns := agentNamespace(t)
	t.Setenv("POD_NAME", "")
	cancel, done, logs := startAgent(t,
		"--kubeconfig", agentKubeconfig(t),
		"--ring", "workers", "--lease-namespace", ns, "--instance", "custom-1", "--lease-duration", "2s",
	)
	g.Eventually(agentLeaseState(ns, "custom-1"), 10*time.Second).Should(Equal(membership.StateReady), "logs:\n%s", logs)
	waitHeld(g, logs)
	lease, err := agentLease(ns, "custom-1")()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(lease.Labels).NotTo(HaveKey(v1alpha1.LabelVirtualNodes))
	g.Expect(lease.OwnerReferences).To(BeEmpty())
	// Without a health endpoint the agent cannot tell whether the
	// controller still reconciles: it leaves the Lease to expire.
	cancel()
	g.Eventually(done, 10*time.Second).Should(Receive(BeNil()))
	done <- nil
	g.Expect(agentLease(ns, "custom-1")()).To(HaveField("Spec.HolderIdentity", HaveValue(Equal("custom-1"))))
	g.Expect(logs.String()).To(ContainSubstring("Not releasing the instance Lease"))
}

// TestAgentFlagErrors checks that bad flags fail before anything runs.
func TestAgentFlagErrors(t *testing.T) {
	kubeconfig := agentKubeconfig(t)
	base := []string{"--kubeconfig", kubeconfig, "--instance", "i-0"}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no ring", []string{"--lease-namespace", "ns"}, "--ring is required"},
		{"no lease namespace", []string{"--ring", "r"}, "--lease-namespace is required"},
		{"fractional lease duration", []string{"--ring", "r", "--lease-namespace", "ns", "--lease-duration", "1500ms"}, "whole number of seconds"},
		{"renew period too long", []string{"--ring", "r", "--lease-namespace", "ns", "--lease-duration", "2s", "--renew-period", "3s"}, "renew period"},
		{"renew deadline past the lease duration", []string{"--ring", "r", "--lease-namespace", "ns", "--lease-duration", "3s", "--renew-deadline", "4s"}, "renew deadline"},
		{"negative weight", []string{"--ring", "r", "--lease-namespace", "ns", "--virtual-nodes", "-2"}, "virtual nodes"},
		{"relative health URL", []string{"--ring", "r", "--lease-namespace", "ns", "--health-url", "/healthz"}, "--health-url"},
		{"bad instance ID", []string{"--ring", "r", "--lease-namespace", "ns", "--instance", "Not_A_Name"}, "instance ID"},
		{"instance ID too long for a label", []string{"--ring", "r", "--lease-namespace", "ns", "--instance", strings.Repeat("i", 64)}, "--instance"},
		{"bad log level", []string{"--ring", "r", "--lease-namespace", "ns", "--log-level", "loud"}, "--log-level"},
		{"arguments", []string{"--ring", "r", "--lease-namespace", "ns", "extra"}, "unknown command"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			cmd := NewAgentCommand()
			var out bytes.Buffer
			cmd.SetOut(&out)
			cmd.SetErr(&out)
			cmd.SetArgs(append(append([]string{}, base...), tc.args...))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := cmd.ExecuteContext(ctx)
			g.Expect(err).To(MatchError(ContainSubstring(tc.want)))
		})
	}
}

// TestControllerGone: after SIGTERM only a refused connection counts as a
// stopped controller; an error status or a hanging endpoint means it may
// still be reconciling.
func TestControllerGone(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int // 0: the handler hangs until the server closes
		closed bool
		want   bool
	}{
		{name: "healthy", status: http.StatusOK},
		{name: "unhealthy while shutting down", status: http.StatusServiceUnavailable},
		{name: "hanging"},
		{name: "nothing listens", status: http.StatusOK, closed: true, want: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			release := make(chan struct{})
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				if tc.status == 0 {
					<-release
					return
				}
				w.WriteHeader(tc.status)
			}))
			stop := func() { close(release); srv.Close() }
			if tc.closed {
				stop()
			} else {
				defer stop()
			}
			o := &agentOptions{healthURL: srv.URL + "/healthz"}
			NewWithT(t).Expect(o.controllerGone(context.Background())).To(Equal(tc.want))
		})
	}
}

// TestAgentDefaultIDTooLong checks that a pod name that cannot be a label
// value is refused with advice, before anything runs.
func TestAgentDefaultIDTooLong(t *testing.T) {
	g := NewWithT(t)
	long := "worker." + strings.Repeat("w", 60)
	t.Setenv("POD_NAME", long)
	cmd := NewAgentCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs([]string{"--kubeconfig", agentKubeconfig(t), "--ring", "r", "--lease-namespace", "ns"})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := cmd.ExecuteContext(ctx)
	g.Expect(err).To(MatchError(And(ContainSubstring("--instance"), ContainSubstring(long), ContainSubstring("63"))))
}

// freeAddress returns a loopback address with a port nothing listens on.
func freeAddress(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}
