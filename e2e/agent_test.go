package e2e

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/internal/localrun"
	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// reconcileDurationAnnotation makes a reconcile of the plain controller
// take as long as it says (e2e/plaincontroller).
const reconcileDurationAnnotation = "e2e.sharder.dev/reconcile-duration"

// AgentShutdownInput configures AgentShutdownSpec.
type AgentShutdownInput struct {
	// Objects is the number of ConfigMaps in the ring.
	Objects int
	// ReconcileDuration is how long the reconcile in flight at SIGTERM
	// lasts; longer than twice the lease duration, so that a Lease left to
	// expire would not protect it either.
	ReconcileDuration time.Duration
	// ShutdownTimeout of the agents: longer than ReconcileDuration.
	ShutdownTimeout time.Duration
	// Timeout bounds each wait.
	Timeout time.Duration
}

// AgentShutdownSpec: a controller that knows nothing of sharder beyond the
// label selector of its cache runs beside `sharder agent`. Both get SIGTERM
// at once while the controller reconciles an object, as the containers of
// a deleted pod do. The agent keeps the Lease while the controller's health
// endpoint answers and releases it once the controller has exited, so the
// sharder moves the controller's objects only after its last reconcile
// ended, and without waiting for the Lease to expire: no object is ever
// reconciled by two instances at once.
func AgentShutdownSpec(t *testing.T, in AgentShutdownInput) {
	e := newRingEnv(t, ringOptions{
		Resources:   []sharderv1alpha1.RingResource{{Group: "", Resource: "configmaps"}},
		Watched:     corev1.SchemeGroupVersion.WithResource("configmaps"),
		TrackedKind: schema.GroupKind{Kind: "ConfigMap"},
	})
	shutdownTimeout := "--shutdown-timeout=" + in.ShutdownTimeout.String()
	e.startPlainInstance("instance-0", shutdownTimeout)
	e.startPlainInstance("instance-1", shutdownTimeout)
	e.startSharders()
	for i := range in.Objects {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: e.namespace, Name: fmt.Sprintf("obj-%03d", i)}}
		e.g.Expect(e.c.Create(e.ctx, cm)).To(gomega.Succeed())
	}
	before := e.waitSettled(in.Objects, in.Timeout)
	e.expectReconciledByOwner(in.Timeout)

	victim := "instance-0"
	var theirs []string
	for _, o := range before {
		if o.Instance == victim {
			theirs = append(theirs, o.Key)
		}
	}
	e.g.Expect(theirs).NotTo(gomega.BeEmpty(), "assignment: %v", before.Counts())

	// A slow reconcile of one of the victim's objects is in flight...
	slow := theirs[0]
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, reconcileDurationAnnotation, in.ReconcileDuration)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: e.namespace, Name: strings.TrimPrefix(slow, e.namespace+"/")}}
	e.g.Expect(e.c.Patch(e.ctx, cm, client.RawPatch("application/merge-patch+json", []byte(patch)))).To(gomega.Succeed())
	e.g.Eventually(func() bool {
		for _, iv := range e.intervals() {
			if iv.Open && iv.Instance == victim && iv.Object == slow {
				return true
			}
		}
		return false
	}).WithTimeout(in.Timeout).WithPolling(50*time.Millisecond).Should(gomega.BeTrue(), "%s never started reconciling %s", victim, slow)

	// ...when the pod's containers get SIGTERM together.
	controller, agent := e.instance(victim), e.agent(victim)
	var wg sync.WaitGroup
	stopErrs := make([]error, 2)
	for i, p := range []*localrun.Process{controller, agent} {
		wg.Add(1)
		go func() { defer wg.Done(); stopErrs[i] = p.Stop(in.ShutdownTimeout + in.Timeout) }()
	}
	wg.Wait()
	e.g.Expect(stopErrs).To(gomega.HaveEach(gomega.Succeed()), "controller and agent exit cleanly")

	after := e.waitSettled(in.Objects, in.Timeout, "instance-1")
	e.expectReconciledByOwner(in.Timeout)
	e.expectNoOverlap()
	// Moved only after the stopped controller's last reconcile had ended.
	var lastEnd time.Time
	for _, iv := range e.intervals() {
		if iv.Instance == victim && iv.End.After(lastEnd) {
			lastEnd = iv.End
		}
	}
	var lastMove time.Time
	for _, k := range theirs {
		o, _ := e.tracker.Get(k)
		e.g.Expect(o.Changed).To(gomega.BeTemporally(">=", lastEnd), "%s moved before %s's last reconcile ended", k, victim)
		if o.Changed.After(lastMove) {
			lastMove = o.Changed
		}
	}
	t.Logf("%d objects of %s moved within %s of the end of its last reconcile", len(theirs), victim, lastMove.Sub(lastEnd))
	prev := before.ByKey()
	for _, o := range after {
		if prev[o.Key] != victim {
			e.g.Expect(o.Instance).To(gomega.Equal(prev[o.Key]), "%s was not on the stopped instance but moved", o.Key)
		}
	}
	// Released once the controller was gone, not left to expire: the sharder
	// moved the objects at once and holds the released Lease while they move
	// (or held it, and it is still the sharder's).
	e.g.Expect(agent.Logs()).To(gomega.ContainSubstring("Released the instance Lease"))
	e.g.Expect(ptr.Deref(e.lease(victim).Spec.HolderIdentity, "")).To(gomega.Or(gomega.BeEmpty(), gomega.HavePrefix("sharder:")))
}

func TestAgentShutdown(t *testing.T) {
	AgentShutdownSpec(t, AgentShutdownInput{Objects: 10, ReconcileDuration: 8 * time.Second, ShutdownTimeout: 30 * time.Second, Timeout: 60 * time.Second})
}

// startPlainInstance starts the plain controller as instance id with
// `sharder agent` beside it (given extra agent flags), each restarted when
// it exits as a pod's containers are, and waits until the agent holds the
// instance's Lease.
func (e *ringEnv) startPlainInstance(id string, agentArgs ...string) {
	e.t.Helper()
	controller, agent := e.launchPlainInstance(id, agentArgs...)
	e.waitHeld(id, controller, agent)
}

// launchPlainInstance starts the plain controller and its agent as
// instance id without waiting for the Lease.
func (e *ringEnv) launchPlainInstance(id string, agentArgs ...string) (controller, agent *localrun.Process) {
	e.t.Helper()
	health, err := localrun.FreeAddress()
	e.g.Expect(err).NotTo(gomega.HaveOccurred())
	controller, err = cluster.Start(localrun.ProcessOptions{
		Name: e.ring + "-" + id, Path: cluster.Binaries.PlainController,
		Args: []string{
			"--kubeconfig", e.instanceUser.Kubeconfig,
			"--namespace", e.namespace,
			"--selector", sharderv1alpha1.ShardLabel(e.ring) + "=" + id,
			"--name", id,
			"--health-probe-bind-address", health,
			"--reconcile-log", e.reconcileLog(id),
		},
		Restart: instanceRestart,
	})
	e.g.Expect(err).NotTo(gomega.HaveOccurred())
	e.procs.Add(controller)
	return controller, e.launchAgent(id, controller, health, agentArgs...)
}

// launchAgent starts `sharder agent` for instance id, asking the health
// endpoint of controller at health (host:port), and records both as the
// instance.
func (e *ringEnv) launchAgent(id string, controller *localrun.Process, health string, agentArgs ...string) *localrun.Process {
	e.t.Helper()
	agent, err := cluster.Start(localrun.ProcessOptions{
		Name: e.ring + "-" + id + "-agent", Path: cluster.Binaries.Sharder,
		Args: append([]string{"agent",
			"--kubeconfig", e.instanceUser.Kubeconfig,
			"--ring", e.ring,
			"--lease-namespace", e.leaseNamespace,
			"--instance", id,
			"--lease-duration", e.opts.LeaseDuration.String(),
			"--health-url", "http://" + health + "/healthz",
			"--log-format", "console",
		}, agentArgs...),
		Restart: instanceRestart,
	})
	e.g.Expect(err).NotTo(gomega.HaveOccurred())
	e.procs.Add(agent)
	e.setInstance(id, controller)
	e.mu.Lock()
	e.agents[id] = agent
	e.mu.Unlock()
	return agent
}

// agent returns the agent beside instance id.
func (e *ringEnv) agent(id string) *localrun.Process {
	e.mu.Lock()
	defer e.mu.Unlock()
	p, ok := e.agents[id]
	if !ok {
		e.t.Fatalf("no agent for instance %s", id)
	}
	return p
}
