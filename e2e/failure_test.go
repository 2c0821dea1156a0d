package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// InstanceKilledInput configures InstanceKilledSpec.
type InstanceKilledInput struct {
	// Instances before one is killed.
	Instances int
	// Objects is the number of EtcdClusters.
	Objects int
	// LeaseDuration of the instances' Leases.
	LeaseDuration time.Duration
	// Slack is how long after the lease protocol declares the instance dead
	// (2 × LeaseDuration after its last renewal) its objects must have moved.
	Slack time.Duration
	// Timeout bounds each wait.
	Timeout time.Duration
}

// InstanceKilledSpec: an instance killed with SIGKILL keeps its objects
// while its Lease is merely expired or uncertain; they move only once the
// lease protocol declares it dead (2 × lease duration after its last
// renewal), and then all of them at once.
func InstanceKilledSpec(t *testing.T, in InstanceKilledInput) {
	e := newRingEnv(t, ringOptions{LeaseDuration: in.LeaseDuration})
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
	e.killInstance(victim)
	lastRenewal := e.lease(victim).Spec.RenewTime.Time
	deadAt := lastRenewal.Add(2 * in.LeaseDuration)

	// Until the Lease is uncertain, nothing moves.
	if wait := time.Until(deadAt.Add(-200 * time.Millisecond)); wait > 0 {
		e.g.Consistently(func() error {
			for _, k := range theirs {
				if o, _ := e.tracker.Get(k); o.Instance != victim {
					return fmt.Errorf("%s moved to %q before the lease protocol declared %s dead", k, o.Instance, victim)
				}
			}
			return nil
		}).WithTimeout(wait).WithPolling(100 * time.Millisecond).Should(gomega.Succeed())
	}

	after := e.waitSettled(in.Objects, in.Timeout, e.liveInstances()...)
	for _, k := range theirs {
		o, _ := e.tracker.Get(k)
		e.g.Expect(o.Changed).To(gomega.BeTemporally(">=", deadAt), "%s moved before 2 × lease duration", k)
		e.g.Expect(o.Changed).To(gomega.BeTemporally("<=", deadAt.Add(in.Slack)), "%s moved long after its instance was dead", k)
	}
	prev := before.ByKey()
	for _, o := range after {
		if prev[o.Key] != victim {
			e.g.Expect(o.Instance).To(gomega.Equal(prev[o.Key]), "%s was not on the killed instance but moved", o.Key)
		}
	}
	state := e.lease(victim).Labels[sharderv1alpha1.LabelState]
	e.g.Expect(state).To(gomega.Equal("dead"))
	e.expectReconciledByOwner(in.Timeout)
	e.expectNoOverlap()
}

func TestInstanceKilled(t *testing.T) {
	InstanceKilledSpec(t, InstanceKilledInput{Instances: 3, Objects: 45, LeaseDuration: 3 * time.Second, Slack: 5 * time.Second, Timeout: 60 * time.Second})
}

// LeaderKilledInput configures LeaderKilledSpec.
type LeaderKilledInput struct {
	// Instances of the operator.
	Instances int
	// Objects before and after the leader is killed.
	Objects int
	// Timeout bounds each wait.
	Timeout time.Duration
}

// LeaderKilledSpec: killing the sharder leader with SIGKILL hands
// leadership to the other replica; the webhook keeps denying forbidden
// edits throughout, objects created meanwhile are assigned by the new
// leader, and nothing is lost or assigned twice.
func LeaderKilledSpec(t *testing.T, in LeaderKilledInput) {
	// The ring asks for protection over availability (failurePolicy Fail):
	// under the default Ignore, a request in flight to the killed replica
	// at the moment of the kill is let through by design.
	e := newRingEnv(t, ringOptions{Sharders: 2, FailurePolicy: admissionregistrationv1.Fail})
	e.startInstances(in.Instances)
	e.startSharders()
	e.createClusters("before", in.Objects)
	e.waitSettled(in.Objects, in.Timeout)
	probe := e.namespace + "/before-000"
	e.waitProtected("before-000", in.Timeout)
	e.g.Expect(e.tryForbiddenEdit(e.ctx, probe)).To(gomega.Succeed())

	old := e.leader()
	e.g.Expect(old.Kill()).To(gomega.Succeed())

	// While the survivor takes over, no forbidden edit gets through.
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	probes := make(chan error, 1)
	go func() {
		defer close(probes)
		for ctx.Err() == nil {
			if err := e.tryForbiddenEditDuringFailover(ctx, probe); err != nil && ctx.Err() == nil {
				probes <- err
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	e.createClusters("during", in.Objects)
	survivor := e.leader()
	e.g.Expect(survivor.Name).NotTo(gomega.Equal(old.Name))
	e.waitSettled(2*in.Objects, in.Timeout)
	cancel()
	for err := range probes {
		e.g.Expect(err).NotTo(gomega.HaveOccurred())
	}
	// And the surviving replica's webhook itself answers, naming label and ring.
	e.g.Expect(e.tryForbiddenEdit(e.ctx, probe)).To(gomega.Succeed())
	e.expectReconciledByOwner(in.Timeout)
	e.expectNoOverlap()
}

// tryForbiddenEditDuringFailover is tryForbiddenEdit for the moment a
// replica dies: a rejection because the webhook could not be called (failure
// policy Fail) counts as well as the webhook's own denial.
func (e *ringEnv) tryForbiddenEditDuringFailover(ctx context.Context, key string) error {
	err := e.tryForbiddenEdit(ctx, key)
	if err != nil && strings.Contains(err.Error(), "failed calling webhook") {
		return nil
	}
	return err
}

// tryForbiddenEdit moves an object to another instance as the admin user
// and returns an error unless the webhook denied it, naming label and ring.
func (e *ringEnv) tryForbiddenEdit(ctx context.Context, key string) error {
	o, ok := e.tracker.Get(key)
	if !ok {
		return fmt.Errorf("%s not tracked", key)
	}
	obj := e.newCluster(o.Key[len(e.namespace)+1:])
	patch := []byte(fmt.Sprintf(`{"metadata":{"labels":{%q:"someone-else"}}}`, sharderv1alpha1.ShardLabel(e.ring)))
	err := e.c.Patch(ctx, obj, client.RawPatch("application/merge-patch+json", patch))
	if err == nil {
		return fmt.Errorf("changing the shard label of %s was allowed", key)
	}
	if !isDenied(err) {
		return fmt.Errorf("changing the shard label of %s: want a denial, got %w", key, err)
	}
	if label := sharderv1alpha1.ShardLabel(e.ring); !strings.Contains(err.Error(), label) {
		return fmt.Errorf("changing the shard label of %s: the denial does not name %s: %w", key, label, err)
	}
	return nil
}

func TestLeaderKilled(t *testing.T) {
	LeaderKilledSpec(t, LeaderKilledInput{Instances: 2, Objects: 30, Timeout: 60 * time.Second})
}
