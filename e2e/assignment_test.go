package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/internal/localrun"
	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// InitialAssignmentInput configures InitialAssignmentSpec.
type InitialAssignmentInput struct {
	// Instances is the number of operator instances.
	Instances int
	// PreExisting EtcdClusters exist before the sharder starts.
	PreExisting int
	// Created EtcdClusters are created once everything runs.
	Created int
	// Timeout bounds each wait for the assignment to settle.
	Timeout time.Duration
}

// InitialAssignmentSpec: objects that exist before the sharder starts and
// objects created afterwards all land on the instance the ring chooses,
// their StatefulSets and Services follow them, and each is reconciled by
// its instance only.
func InitialAssignmentSpec(t *testing.T, in InitialAssignmentInput) {
	e := newRingEnv(t, ringOptions{})
	e.createClusters("pre", in.PreExisting)
	e.startInstances(in.Instances)
	e.startSharders()
	e.waitSettled(in.PreExisting, in.Timeout)

	e.createClusters("new", in.Created)
	a := e.waitSettled(in.PreExisting+in.Created, in.Timeout)
	counts := a.Counts()
	for _, id := range e.liveInstances() {
		e.g.Expect(counts[id]).To(gomega.BeNumerically(">", 0), "every instance gets objects: %v", counts)
	}

	// Children carry their owner's instance.
	owners := a.ByKey()
	e.g.Eventually(func() error {
		var sts appsv1.StatefulSetList
		if err := e.c.List(e.ctx, &sts, client.InNamespace(e.namespace)); err != nil {
			return err
		}
		var svcs corev1.ServiceList
		if err := e.c.List(e.ctx, &svcs, client.InNamespace(e.namespace)); err != nil {
			return err
		}
		if len(sts.Items) < len(owners) {
			return fmt.Errorf("%d StatefulSets for %d EtcdClusters", len(sts.Items), len(owners))
		}
		children := make([]client.Object, 0, len(sts.Items)+len(svcs.Items))
		for i := range sts.Items {
			children = append(children, &sts.Items[i])
		}
		for i := range svcs.Items {
			children = append(children, &svcs.Items[i])
		}
		for _, child := range children {
			ref := metav1ControllerOf(child)
			if ref == "" {
				continue
			}
			want := owners[e.namespace+"/"+ref]
			if got := child.GetLabels()[sharderv1alpha1.ShardLabel(e.ring)]; got != want {
				return fmt.Errorf("%T %s carries instance %q, its owner %s is on %q", child, child.GetName(), got, ref, want)
			}
		}
		return nil
	}).WithTimeout(in.Timeout).WithPolling(250 * time.Millisecond).Should(gomega.Succeed())

	e.expectReconciledByOwner(in.Timeout)
	e.expectNoOverlap()
}

func TestInitialAssignment(t *testing.T) {
	InitialAssignmentSpec(t, InitialAssignmentInput{Instances: 3, PreExisting: 60, Created: 40, Timeout: 60 * time.Second})
}

// ScaleOutInput configures ScaleOutSpec.
type ScaleOutInput struct {
	// Instances before the scale-out; one more is added.
	Instances int
	// Objects is the number of EtcdClusters.
	Objects int
	// Timeout bounds each wait.
	Timeout time.Duration
}

// ScaleOutSpec: a new instance takes over its share; only objects that move
// to it move, each after its old instance acknowledged the drain, and no
// object is ever reconciled by two instances at once.
func ScaleOutSpec(t *testing.T, in ScaleOutInput) {
	e := newRingEnv(t, ringOptions{})
	e.startInstances(in.Instances)
	e.startSharders()
	e.createClusters("obj", in.Objects)
	before := e.waitSettled(in.Objects, in.Timeout)
	e.expectReconciledByOwner(in.Timeout)

	added := fmt.Sprintf("instance-%d", in.Instances)
	e.startInstance(added)
	after := e.waitSettled(in.Objects, in.Timeout)

	prev := before.ByKey()
	moved := 0
	for _, o := range after {
		if prev[o.Key] != o.Instance {
			moved++
			e.g.Expect(o.Instance).To(gomega.Equal(added), "%s moved from %s to %s, not to the new instance", o.Key, prev[o.Key], o.Instance)
		}
	}
	e.g.Expect(moved).To(gomega.BeNumerically(">", 0), "the new instance got no objects")
	ideal := float64(in.Objects) / float64(in.Instances+1)
	e.g.Expect(float64(moved)).To(gomega.BeNumerically("<=", 2*ideal), "moved %d objects, ideal %.0f", moved, ideal)

	e.expectReconciledByOwner(in.Timeout)
	e.expectNoOverlap()
}

func TestScaleOut(t *testing.T) {
	ScaleOutSpec(t, ScaleOutInput{Instances: 2, Objects: 60, Timeout: 60 * time.Second})
}

// ScaleInInput configures ScaleInSpec.
type ScaleInInput struct {
	// Instances before one of them is stopped.
	Instances int
	// Objects is the number of EtcdClusters.
	Objects int
	// LeaseDuration of the instances: long, to show that a graceful stop
	// does not wait for the Lease to expire.
	LeaseDuration time.Duration
	// Timeout bounds each wait.
	Timeout time.Duration
}

// ScaleInSpec: an instance stopped with SIGTERM finishes, releases its
// Lease, and its objects move to the others at once, well before its Lease
// would have expired.
func ScaleInSpec(t *testing.T, in ScaleInInput) {
	e := newRingEnv(t, ringOptions{LeaseDuration: in.LeaseDuration})
	e.startInstances(in.Instances)
	e.startSharders()
	e.createClusters("obj", in.Objects)
	before := e.waitSettled(in.Objects, in.Timeout)
	e.expectReconciledByOwner(in.Timeout)

	stopped := "instance-0"
	stoppedAt := time.Now()
	e.stopInstance(stopped)
	// Released (or already held by the sharder while the objects move).
	e.g.Expect(ptr.Deref(e.lease(stopped).Spec.HolderIdentity, "")).To(gomega.Or(gomega.BeEmpty(), gomega.HavePrefix("sharder:")),
		"a stopped instance releases its Lease")

	after := e.waitSettled(in.Objects, in.LeaseDuration, e.liveInstances()...)
	e.g.Expect(time.Since(stoppedAt)).To(gomega.BeNumerically("<", in.LeaseDuration), "objects moved only after the Lease would have expired")
	prev := before.ByKey()
	for _, o := range after {
		if prev[o.Key] != stopped {
			e.g.Expect(o.Instance).To(gomega.Equal(prev[o.Key]), "%s was not on the stopped instance but moved", o.Key)
		}
	}
	e.expectReconciledByOwner(in.Timeout)
	e.expectNoOverlap()
	e.g.Expect(localrun.Moved(before, after)).To(gomega.Equal(before.Counts()[stopped]))
}

func TestScaleIn(t *testing.T) {
	ScaleInSpec(t, ScaleInInput{Instances: 3, Objects: 60, LeaseDuration: 20 * time.Second, Timeout: 60 * time.Second})
}
