package e2e

import (
	"bufio"
	"fmt"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/onsi/gomega"

	"github.com/sharder-dev/sharder/internal/localrun"
)

// LeaderPausedInput configures LeaderPausedSpec.
type LeaderPausedInput struct {
	// Instances of the operator.
	Instances int
	// Objects is the number of EtcdClusters; each has controlled objects.
	Objects int
	// LeaderLeaseDuration is the sharder's leader-election Lease duration:
	// long enough that the pause (the instance's lease duration and a
	// second or two) ends within its renew deadline.
	LeaderLeaseDuration time.Duration
	// WriteDelay slows every request of the leader, both ways, so that a
	// gone instance's moves are still being written when it pauses.
	WriteDelay time.Duration
	// Timeout bounds each wait.
	Timeout time.Duration
}

// LeaderPausedSpec: the band TestLeaderFrozen leaves out. The sharder's
// leader is paused (SIGSTOP) while it moves a stopped instance's objects
// under its hold of the instance's Lease, for less than its own lease, so
// that it keeps leading; meanwhile the instance starts again under the same
// ID and acquires its Lease once it watched the hold unrenewed for its
// duration. When the leader resumes, none of the moves it decided before
// the pause lands on the instance that came back: those it had sent fail on
// their write deadline (2 s from the send, which the pause outlasts), those
// it had not sent yet are refused at admission (the instance holds its
// Lease again; counted in the log), and the sharder decides again. No two
// instances ever reconcile one object at once, every object ends on the
// instance the ring chooses, no controlled object ends away from its owner,
// and the paused replica leads throughout. TestLateMoveOffABackInstanceIsDenied
// (pkg/sharder/webhook) sends such a late move at a chosen moment.
func LeaderPausedSpec(t *testing.T, in LeaderPausedInput) {
	e := newRingEnv(t, ringOptions{LeaderLeaseDuration: in.LeaderLeaseDuration})
	e.startInstances(in.Instances)
	// The replicas reach the API server through proxies of their own, so
	// that the leader's writes can be slowed.
	u, err := url.Parse(cluster.ControlPlane.Config.Host)
	e.g.Expect(err).NotTo(gomega.HaveOccurred())
	proxies := map[*localrun.Sharder]*localrun.FaultProxy{}
	for i := range 2 {
		name := fmt.Sprintf("%s-sharder-%d", e.ring, i)
		p, err := localrun.NewFaultProxy(u.Host)
		e.g.Expect(err).NotTo(gomega.HaveOccurred())
		t.Cleanup(func() { _ = p.Close() })
		kubeconfig := filepath.Join(cluster.Dir, e.ring, name+".kubeconfig")
		e.g.Expect(localrun.WriteProxiedKubeconfig(cluster.SharderUser.Kubeconfig, kubeconfig, u.Host, p)).To(gomega.Succeed())
		s, err := cluster.StartSharder(e.ctx, localrun.SharderOptions{Name: name, Namespace: e.sharderNamespace, Restart: instanceRestart,
			Kubeconfig: kubeconfig, LeaderLeaseDuration: in.LeaderLeaseDuration})
		e.g.Expect(err).NotTo(gomega.HaveOccurred())
		e.procs.Add(s.Process)
		e.mu.Lock()
		e.sharders = append(e.sharders, s)
		e.mu.Unlock()
		proxies[s] = p
	}
	leader := e.leader()
	e.createClusters("obj", in.Objects)
	before := e.waitSettled(in.Objects, in.Timeout)
	e.expectReconciledByOwner(in.Timeout)

	victim := "instance-1"
	var theirs []string
	for _, o := range before {
		if o.Instance == victim {
			theirs = append(theirs, o.Key)
		}
	}
	e.g.Expect(theirs).NotTo(gomega.BeEmpty())
	firstChildMoved := e.firstChildMoved(victim)
	deniedBefore := deniedMoves(e)

	// The victim stops and releases its Lease; the leader holds it and
	// moves its objects, slowly. It pauses as soon as the first controlled
	// object has moved, with the rest of the moves in its hands.
	proxies[leader].Set(localrun.Delay, in.WriteDelay)
	e.g.Expect(e.instance(victim).Stop(30 * time.Second)).To(gomega.Succeed())
	firstChildMoved(in.Timeout)
	resume := e.pause(leader)
	pausedAt := time.Now()
	moved := e.movedAway(theirs, victim)

	// The victim comes back under its ID and acquires its Lease while the
	// leader is paused; the leader resumes at once, within its lease.
	e.launchInstance(victim, e.opts.LeaseDuration)
	e.waitHeld(victim, e.instance(victim))
	resume()
	paused := time.Since(pausedAt)
	proxies[leader].Set(localrun.Pass, 0)
	e.g.Expect(paused).To(gomega.BeNumerically("<", in.LeaderLeaseDuration*3/4), "the pause outlasted the leader's renew deadline")

	e.waitSettled(in.Objects, in.Timeout, e.liveInstances()...)
	e.expectReconciledByOwner(in.Timeout)
	e.expectChildrenWithOwners(in.Timeout)
	ivs := e.expectNoOverlap()
	e.g.Expect(e.leader()).To(gomega.BeIdenticalTo(leader), "the paused replica lost its leadership: the pause left the band")
	e.g.Expect(leader.Restarts()).To(gomega.BeZero())
	t.Logf("leader paused for %s after %d of %s's %d objects moved; %d late moves refused at admission; %d reconciles checked",
		paused.Round(100*time.Millisecond), moved, victim, len(theirs), deniedMoves(e)-deniedBefore, len(ivs))
}

// deniedMoves sums, over the sharder's replicas, the webhook's denials of
// the sharder's moves off an instance that holds its Lease again.
func deniedMoves(e *ringEnv) int {
	total := 0
	for _, s := range e.liveSharders() {
		resp, err := http.Get("http://" + s.MetricsAddress + "/metrics")
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if !strings.HasPrefix(line, "sharder_webhook_decisions_total{") || !strings.Contains(line, `reason="sharder-instance-holds-lease"`) ||
				!strings.Contains(line, `ring="`+e.ring+`"`) {
				continue
			}
			if n, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64); err == nil {
				total += int(n)
			}
		}
		_ = resp.Body.Close()
	}
	return total
}

func TestLeaderPaused(t *testing.T) {
	LeaderPausedSpec(t, LeaderPausedInput{Instances: 3, Objects: 30, LeaderLeaseDuration: 15 * time.Second,
		WriteDelay: 200 * time.Millisecond, Timeout: 60 * time.Second})
}
