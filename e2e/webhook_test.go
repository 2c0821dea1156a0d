package e2e

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/internal/localrun"
	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// isDenied reports whether err is an admission webhook's denial.
func isDenied(err error) bool {
	return err != nil && strings.Contains(err.Error(), "denied the request")
}

// ForbiddenEditsInput configures ForbiddenEditsSpec.
type ForbiddenEditsInput struct {
	// Instances of the operator.
	Instances int
	// Timeout bounds each wait.
	Timeout time.Duration
}

// ForbiddenEditsSpec: nobody but the sharder may set, change or remove a
// shard or drain label; the denial names the label and the ring. Ordinary
// edits pass, and so does a new object labelled for a ready instance (the
// sharder then moves it to the ring's choice); one labelled for an instance
// the ring does not have is denied.
func ForbiddenEditsSpec(t *testing.T, in ForbiddenEditsInput) {
	e := newRingEnv(t, ringOptions{})
	e.startInstances(in.Instances)
	e.startSharders()
	e.createClusters("obj", 1)
	a := e.waitSettled(1, in.Timeout)
	name := "obj-000"
	e.waitProtected(name, in.Timeout)
	owner := a[0].Instance
	shard, drain := sharderv1alpha1.ShardLabel(e.ring), sharderv1alpha1.DrainLabel(e.ring)

	instanceClient, err := client.New(e.instanceUser.Config, client.Options{Scheme: cluster.ControlPlane.Env.Scheme})
	e.g.Expect(err).NotTo(gomega.HaveOccurred())
	adminClient := e.c

	patch := func(c client.Client, labels string) error {
		return c.Patch(e.ctx, e.newCluster(name), client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":`+labels+`}}`)))
	}
	denials := []struct {
		what   string
		c      client.Client
		labels string
		label  string
	}{
		{"moving the object to another instance", adminClient, fmt.Sprintf(`{%q:"elsewhere"}`, shard), shard},
		{"removing the shard label", adminClient, fmt.Sprintf(`{%q:null}`, shard), shard},
		{"asking for a drain", adminClient, fmt.Sprintf(`{%q:"true"}`, drain), drain},
		{"an instance dropping an object it was not asked to drain", instanceClient, fmt.Sprintf(`{%q:null,%q:null}`, shard, drain), shard},
	}
	for _, d := range denials {
		err := patch(d.c, d.labels)
		e.g.Expect(isDenied(err)).To(gomega.BeTrue(), "%s: want a denial, got %v", d.what, err)
		e.g.Expect(err.Error()).To(gomega.ContainSubstring(d.label), "%s: the denial names the label", d.what)
		e.g.Expect(err.Error()).To(gomega.ContainSubstring(e.ring), "%s: the denial names the ring", d.what)
	}
	e.g.Consistently(func() string {
		o, _ := e.tracker.Get(e.namespace + "/" + name)
		return o.Instance
	}).WithTimeout(time.Second).Should(gomega.Equal(owner), "denied edits leave the assignment alone")

	// An ordinary edit passes.
	e.g.Expect(patch(adminClient, `{"team":"storage"}`)).To(gomega.Succeed())

	// Creating an object labelled for an instance the ring does not have
	// is denied. Labelled for a ready instance it is allowed, even one the
	// ring would not choose (membership may change between a client's
	// choice and the create): the sharder moves it to its choice.
	key := e.namespace + "/labelled"
	want, err := localrun.Desired(etcdClusterKind, []string{key}, e.liveInstances())
	e.g.Expect(err).NotTo(gomega.HaveOccurred())
	unknown := e.newCluster("labelled")
	unknown.Labels = map[string]string{shard: "no-such-instance"}
	err = adminClient.Create(e.ctx, unknown)
	e.g.Expect(isDenied(err)).To(gomega.BeTrue(), "creating with an unknown instance's label: want a denial, got %v", err)
	e.g.Expect(err.Error()).To(gomega.ContainSubstring(shard), "the denial names the label")
	other := e.newCluster("labelled")
	for _, id := range e.liveInstances() {
		if id != want[key] {
			other.Labels = map[string]string{shard: id}
			break
		}
	}
	e.g.Expect(other.Labels).NotTo(gomega.BeEmpty(), "the test needs two live instances")
	e.g.Expect(adminClient.Create(e.ctx, other)).To(gomega.Succeed())
	e.waitSettled(2, in.Timeout)
	e.g.Eventually(func() string {
		o, _ := e.tracker.Get(key)
		return o.Instance
	}).WithTimeout(in.Timeout).Should(gomega.Equal(want[key]), "the sharder moves it to the ring's choice")

	// A denial is not an error of the webhook.
	e.g.Expect(apierrors.IsInternalError(patch(adminClient, fmt.Sprintf(`{%q:"elsewhere"}`, shard)))).To(gomega.BeFalse())
}

func TestForbiddenEdits(t *testing.T) {
	ForbiddenEditsSpec(t, ForbiddenEditsInput{Instances: 2, Timeout: 60 * time.Second})
}

// DrainIdentityInput configures DrainIdentitySpec.
type DrainIdentityInput struct {
	// Objects is the number of EtcdClusters.
	Objects int
	// Timeout bounds each wait.
	Timeout time.Duration
}

// DrainIdentitySpec: while an object waits for its drain to be
// acknowledged, only the ring's instance identity may remove its labels;
// an administrator and another ServiceAccount are denied.
func DrainIdentitySpec(t *testing.T, in DrainIdentityInput) {
	// A long lease and drain timeout keep the frozen instance's drains
	// pending for the whole check.
	e := newRingEnv(t, ringOptions{LeaseDuration: 30 * time.Second, DrainTimeout: 60 * time.Second})
	// Started together: each creates its Lease one of its lease durations
	// after it starts.
	first := e.launchInstance("instance-0", e.opts.LeaseDuration)
	second := e.launchInstance("instance-1", 3*time.Second)
	e.waitHeld("instance-0", first)
	e.waitHeld("instance-1", second)
	e.startSharders()
	e.createClusters("obj", in.Objects)
	e.waitSettled(in.Objects, in.Timeout)
	e.expectReconciledByOwner(in.Timeout)
	e.waitProtected("obj-000", in.Timeout)

	// Freeze instance-0 so it cannot acknowledge, then add an instance:
	// some of instance-0's objects are asked to drain and stay so.
	frozen := e.instance("instance-0")
	e.g.Expect(frozen.Signal(syscall.SIGSTOP)).To(gomega.Succeed())
	defer func() { _ = frozen.Signal(syscall.SIGCONT) }()
	// A short Lease for the newcomer: it becomes ready (and the drains begin)
	// a few seconds after it starts, well before the frozen instance's
	// Lease expires.
	e.startInstanceWithLease("instance-2", 3*time.Second)
	// Pick a draining object the frozen instance is not in the middle of
	// reconciling: acknowledging for it then is what the instance itself
	// would do once idle (acknowledging mid-reconcile would let two
	// instances overlap, which the final check would catch).
	var pending localrun.Watched
	e.g.Eventually(func() error {
		busy := map[string]bool{}
		for _, iv := range e.intervals() {
			if iv.Open && iv.Instance == "instance-0" {
				busy[iv.Object] = true
			}
		}
		for _, o := range e.tracker.Snapshot() {
			if o.Draining && o.Instance == "instance-0" && !busy[o.Key] {
				pending = o
				return nil
			}
		}
		return fmt.Errorf("no idle object of the frozen instance is draining yet")
	}).WithTimeout(in.Timeout).WithPolling(100 * time.Millisecond).Should(gomega.Succeed())

	shard, drain := sharderv1alpha1.ShardLabel(e.ring), sharderv1alpha1.DrainLabel(e.ring)
	ack := []byte(fmt.Sprintf(`{"metadata":{"labels":{%q:null,%q:null}}}`, shard, drain))
	name := pending.Key[len(e.namespace)+1:]
	intruder, err := cluster.ControlPlane.AddServiceAccountUser(e.ring+"-intruder", e.leaseNamespace, "intruder")
	e.g.Expect(err).NotTo(gomega.HaveOccurred())
	for _, u := range []struct {
		who string
		cfg *rest.Config
	}{
		{"an administrator", cluster.ControlPlane.Config},
		{"a ServiceAccount the ring does not list", intruder.Config},
	} {
		c, err := client.New(u.cfg, client.Options{Scheme: cluster.ControlPlane.Env.Scheme})
		e.g.Expect(err).NotTo(gomega.HaveOccurred())
		err = c.Patch(e.ctx, e.newCluster(name), client.RawPatch(types.MergePatchType, ack))
		e.g.Expect(isDenied(err)).To(gomega.BeTrue(), "%s acknowledging a drain: want a denial, got %v", u.who, err)
	}
	// The instance's identity may: this is the acknowledgement the frozen
	// instance would have sent.
	c, err := client.New(e.instanceUser.Config, client.Options{Scheme: cluster.ControlPlane.Env.Scheme})
	e.g.Expect(err).NotTo(gomega.HaveOccurred())
	e.g.Expect(c.Patch(e.ctx, e.newCluster(name), client.RawPatch(types.MergePatchType, ack))).To(gomega.Succeed())

	e.g.Expect(frozen.Signal(syscall.SIGCONT)).To(gomega.Succeed())
	e.waitSettled(in.Objects, in.Timeout)
	e.expectReconciledByOwner(in.Timeout)
	e.expectNoOverlap()
}

func TestDrainIdentity(t *testing.T) {
	DrainIdentitySpec(t, DrainIdentityInput{Objects: 30, Timeout: 60 * time.Second})
}
