package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/internal/localrun"
	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// LeaderFrozenInput configures LeaderFrozenSpec.
type LeaderFrozenInput struct {
	// Instances of the operator.
	Instances int
	// Objects is the number of EtcdClusters; each has controlled objects.
	Objects int
	// LeaderLeaseDuration is the sharder's leader-election Lease duration
	// (localrun's). The leader stays frozen for it plus 5 s.
	LeaderLeaseDuration time.Duration
	// Timeout bounds each wait.
	Timeout time.Duration
}

// LeaderFrozenSpec: the sharder's leader is frozen (SIGSTOP, as a long
// garbage collection or a paused VM would) while it moves a stopped
// instance's objects and their controlled objects, for longer than its
// lease, so that the other replica takes over; meanwhile the instance
// starts again under the same ID. When the old leader resumes, the writes
// it had decided before the freeze must not land: no two instances ever
// reconcile one object at once, every object ends on the instance the ring
// chooses, and no controlled object ends on another instance than its
// owner.
func LeaderFrozenSpec(t *testing.T, in LeaderFrozenInput) {
	e := newRingEnv(t, ringOptions{})
	e.startInstances(in.Instances)
	e.startSharders()
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
	old := e.leader()

	// The victim stops: its Lease is released and the leader moves its
	// objects at once, each one's controlled objects first. The leader
	// freezes as soon as the first controlled object (a ConfigMap) has
	// moved, with the rest of the moves in its hands.
	firstChildMoved := e.firstChildMoved(victim)
	stopped := make(chan error, 1)
	go func() { stopped <- e.instance(victim).Stop(30 * time.Second) }()
	firstChildMoved(in.Timeout)
	resume := e.pause(old)
	frozenAt := time.Now()
	moved := e.movedAway(theirs, victim)

	// The victim comes back under its ID while the leader is frozen, and
	// the other replica takes over.
	e.g.Expect(<-stopped).To(gomega.Succeed(), "stopping %s", victim)
	e.launchInstance(victim, e.opts.LeaseDuration)
	e.g.Eventually(func() error {
		for _, s := range e.liveSharders() {
			if s != old && localrun.IsLeader(s) {
				return nil
			}
		}
		return fmt.Errorf("no other replica leads yet")
	}).WithTimeout(in.Timeout).WithPolling(100 * time.Millisecond).Should(gomega.Succeed())
	if wait := time.Until(frozenAt.Add(in.LeaderLeaseDuration + 5*time.Second)); wait > 0 {
		time.Sleep(wait) // the freeze itself: nothing to synchronise with
	}
	resume()

	resumedAt := time.Now()

	e.waitHeld(victim, e.instance(victim))
	e.waitSettled(in.Objects, in.Timeout, e.liveInstances()...)
	settled := time.Since(resumedAt)
	e.expectReconciledByOwner(in.Timeout)
	e.expectChildrenWithOwners(in.Timeout)
	ivs := e.expectNoOverlap()
	t.Logf("leader frozen for %s after %d of %s's %d objects moved; settled %s after it resumed; %d reconciles checked; sharder restarts %d",
		resumedAt.Sub(frozenAt).Round(100*time.Millisecond), moved, victim, len(theirs), settled.Round(100*time.Millisecond), len(ivs), old.Restarts())
}

func TestLeaderFrozen(t *testing.T) {
	LeaderFrozenSpec(t, LeaderFrozenInput{Instances: 3, Objects: 30, LeaderLeaseDuration: 4 * time.Second, Timeout: 60 * time.Second})
}

var configMaps = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}

// firstChildMoved watches the ConfigMaps the EtcdClusters of instance
// victim control, and returns a wait, up to timeout, until the first of
// them has moved to another instance.
func (e *ringEnv) firstChildMoved(victim string) func(timeout time.Duration) {
	e.t.Helper()
	children, err := localrun.NewLabelWatch(cluster.ControlPlane.Config, configMaps, e.namespace, e.ring)
	e.g.Expect(err).NotTo(gomega.HaveOccurred())
	e.g.Expect(children.Start(e.ctx)).To(gomega.Succeed())
	var theirs []string
	for _, c := range children.Snapshot() {
		if c.Instance == victim {
			theirs = append(theirs, c.Key)
		}
	}
	e.g.Expect(theirs).NotTo(gomega.BeEmpty())
	return func(timeout time.Duration) {
		e.t.Helper()
		e.g.Eventually(func() error {
			for _, k := range theirs {
				if c, _ := children.Get(k); c.Instance != victim {
					return nil
				}
			}
			return fmt.Errorf("none of %s's objects moved yet", victim)
		}).WithTimeout(timeout).WithPolling(time.Millisecond).Should(gomega.Succeed())
	}
}

// pause stops sharder replica s (SIGSTOP) and returns what resumes it
// (SIGCONT), once; it is resumed when the test ends at the latest.
func (e *ringEnv) pause(s *localrun.Sharder) (resume func()) {
	e.t.Helper()
	e.g.Expect(s.Signal(syscall.SIGSTOP)).To(gomega.Succeed())
	var once sync.Once
	resume = func() {
		once.Do(func() { e.g.Expect(s.Signal(syscall.SIGCONT)).To(gomega.Succeed()) })
	}
	e.t.Cleanup(func() { once.Do(func() { _ = s.Signal(syscall.SIGCONT) }) })
	return resume
}

// movedAway counts the tracked objects among keys no longer on victim.
func (e *ringEnv) movedAway(keys []string, victim string) int {
	n := 0
	for _, k := range keys {
		if o, _ := e.tracker.Get(k); o.Instance != victim {
			n++
		}
	}
	return n
}

// controlledKinds are the kinds the example operator creates for an
// EtcdCluster, which the ring's controlledResources cover.
var controlledKinds = []schema.GroupVersionKind{
	{Version: "v1", Kind: "ConfigMap"},
	{Version: "v1", Kind: "Service"},
	{Version: "v1", Kind: "Secret"},
	{Group: "apps", Version: "v1", Kind: "StatefulSet"},
	{Group: "policy", Version: "v1", Kind: "PodDisruptionBudget"},
}

// expectChildrenWithOwners waits until every object an EtcdCluster
// controls carries its owner's shard label.
func (e *ringEnv) expectChildrenWithOwners(timeout time.Duration) {
	e.t.Helper()
	shard := sharderv1alpha1.ShardLabel(e.ring)
	e.g.Eventually(func() error {
		owners := map[types.UID]string{}
		for _, o := range e.listMetadata(etcdClusters.GroupVersion().WithKind(etcdClusterKind.Kind)) {
			owners[o.UID] = o.Labels[shard]
		}
		var bad []string
		for _, gvk := range controlledKinds {
			for _, c := range e.listMetadata(gvk) {
				ref := metav1.GetControllerOfNoCopy(&c)
				if ref == nil {
					continue
				}
				if want, ok := owners[ref.UID]; ok && c.Labels[shard] != want {
					bad = append(bad, fmt.Sprintf("%s %s on %q, its owner %s on %q", gvk.Kind, c.Name, c.Labels[shard], ref.Name, want))
				}
			}
		}
		if len(bad) > 0 {
			return fmt.Errorf("%d controlled objects not on their owner's instance: %s", len(bad), strings.Join(bad[:min(len(bad), 5)], "; "))
		}
		return nil
	}).WithTimeout(timeout).WithPolling(250 * time.Millisecond).Should(gomega.Succeed())
}

// listMetadata lists the metadata of the scenario's objects of kind gvk.
func (e *ringEnv) listMetadata(gvk schema.GroupVersionKind) []metav1.PartialObjectMetadata {
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	e.g.Expect(e.c.List(ctx, list, client.InNamespace(e.namespace))).To(gomega.Succeed())
	return list.Items
}
