package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	etcdv1alpha1 "github.com/sharder-dev/sharder/examples/etcd-operator/api/v1alpha1"
	"github.com/sharder-dev/sharder/internal/localrun"
	"github.com/sharder-dev/sharder/internal/reconcilelog"
	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

var (
	etcdClusters    = etcdv1alpha1.GroupVersion.WithResource("etcdclusters")
	etcdClusterKind = schema.GroupKind{Group: etcdv1alpha1.GroupVersion.Group, Kind: "EtcdCluster"}
)

// instanceAccount is the ServiceAccount the operator's instances run as.
const instanceAccount = "etcd-operator"

// instanceRestart restarts a process that exits on its own (an instance
// that lost its Lease, or a sharder replica that lost its leadership, exits
// on purpose), as the kubelet restarts the containers of their pods: every
// instance process, the plain controller and its agent included, and every
// sharder replica runs under it (localrun.IsLeader reads the current run).
// A scenario ends a process for good with Stop or Kill (stopInstance,
// killInstance); a run ended by Signal is restarted.
var instanceRestart = &localrun.RestartPolicy{}

// ringOptions shape one scenario's ring.
type ringOptions struct {
	// Sharders is the number of sharder replicas. Default: 2.
	Sharders int
	// LeaseDuration of the instances' Leases. Default: 3s.
	LeaseDuration time.Duration
	// LeaderLeaseDuration of the sharder's leader election. Default:
	// localrun's (4s).
	LeaderLeaseDuration time.Duration
	// DrainTimeout of the ring. Default: 5s.
	DrainTimeout time.Duration
	// FailurePolicy of the ring's webhooks. Default: the API's (Ignore).
	FailurePolicy admissionregistrationv1.FailurePolicyType
	// Resources of the ring. Default: EtcdClusters and everything they
	// control.
	Resources []sharderv1alpha1.RingResource
	// Watched is the resource the tracker watches, TrackedKind its kind.
	// Default: EtcdClusters.
	Watched     schema.GroupVersionResource
	TrackedKind schema.GroupKind
	// ServiceAccounts runs the sharder replicas and the instances as
	// ordinary ServiceAccounts (sharderAccount in the sharder's namespace,
	// instanceAccount in the Lease namespace; cluster-admin by RBAC), not
	// as members of system:masters, whose requests API Priority and
	// Fairness exempts. Default: false.
	ServiceAccounts bool
	// Slots, when positive, makes the ring one of unit Slots with that many
	// slots (docs/design.md §11); the operator's instances read the ring's
	// unit at start and run in slot mode. Default: 0, a ring of unit
	// Objects.
	Slots int
	// InstanceBinary is the program the operator's instances run: the
	// example operator of an earlier release (TestSkewPreviousInstances).
	// Default: the example operator built from this tree.
	InstanceBinary string
}

// sharderAccount is the ServiceAccount the sharder replicas run as with
// ringOptions.ServiceAccounts.
const sharderAccount = "sharder"

// ringEnv is one scenario's world: a ring of EtcdClusters in a namespace of
// its own, its sharder replicas and operator instances, and a tracker of
// the EtcdClusters' labels.
type ringEnv struct {
	t    *testing.T
	g    gomega.Gomega
	ctx  context.Context
	opts ringOptions
	c    client.Client

	ring             string
	namespace        string
	leaseNamespace   string
	sharderNamespace string
	reconcileLogs    string
	instanceUser     *localrun.User
	tracker          *localrun.LabelWatch
	// sharderUser is the sharder replicas' identity; nil: the cluster's
	// SharderUser.
	sharderUser *localrun.User
	// accounts binds the ServiceAccounts to cluster-admin; removed once the
	// processes have stopped.
	accounts *rbacv1.ClusterRoleBinding

	mu       sync.Mutex
	sharders []*localrun.Sharder
	// instances are the instance processes (the plain controller's beside
	// an agent), by instance ID.
	instances map[string]*localrun.Process
	// earlier are the instance processes an ID had before its current one
	// (a process started again under the same ID after the first was
	// stopped or killed for good), whose runs' exits still end the
	// reconciles they left open.
	earlier map[string][]*localrun.Process
	// agents are the `sharder agent` sidecars, by instance ID.
	agents map[string]*localrun.Process
	procs  localrun.Processes
}

// newRingEnv creates the namespaces and the ring and starts the sharder
// replicas. Processes are stopped when the test ends; their logs are
// printed if it failed.
func newRingEnv(t *testing.T, opts ringOptions) *ringEnv {
	t.Helper()
	if opts.Sharders == 0 {
		opts.Sharders = 2
	}
	if opts.LeaseDuration == 0 {
		opts.LeaseDuration = 3 * time.Second
	}
	if opts.DrainTimeout == 0 {
		opts.DrainTimeout = 5 * time.Second
	}
	if opts.Resources == nil {
		opts.Resources = []sharderv1alpha1.RingResource{{
			Group:    etcdClusterKind.Group,
			Resource: etcdClusters.Resource,
			// Everything an EtcdCluster controls follows it.
			ControlledResources: []metav1.GroupResource{
				{Group: "", Resource: "configmaps"},
				{Group: "", Resource: "services"},
				{Group: "apps", Resource: "statefulsets"},
				{Group: "policy", Resource: "poddisruptionbudgets"},
				{Group: "", Resource: "secrets"},
				{Group: "", Resource: "pods"},
			},
		}}
	}
	if opts.Watched.Empty() {
		opts.Watched, opts.TrackedKind = etcdClusters, etcdClusterKind
	}
	ctx, cancel := context.WithCancel(context.Background())
	suffix := make([]byte, 3)
	_, _ = rand.Read(suffix)
	name := "e2e-" + hex.EncodeToString(suffix)
	e := &ringEnv{
		t: t, g: gomega.NewWithT(t), ctx: ctx, opts: opts, c: cluster.Client(),
		ring: name, namespace: name, leaseNamespace: name + "-instances", sharderNamespace: name + "-sharder",
		reconcileLogs: filepath.Join(cluster.Dir, name, "reconciles"),
		instances:     map[string]*localrun.Process{},
		earlier:       map[string][]*localrun.Process{},
		agents:        map[string]*localrun.Process{},
	}
	t.Cleanup(func() {
		e.stopAll()
		if t.Failed() {
			e.procs.DumpLogs(os.Stderr)
		}
		cancel()
		if e.accounts != nil {
			_ = e.c.Delete(context.Background(), e.accounts)
		}
		r := &sharderv1alpha1.ControllerRing{ObjectMeta: metav1.ObjectMeta{Name: e.ring}}
		_ = client.IgnoreNotFound(e.c.Delete(context.Background(), r))
		// Nothing collects a test's Services (no controller manager), and
		// each holds one of the API server's few ClusterIPs.
		_ = e.c.DeleteAllOf(context.Background(), &corev1.Service{}, client.InNamespace(e.namespace))
	})
	g := e.g
	g.Expect(os.MkdirAll(e.reconcileLogs, 0o750)).To(gomega.Succeed())
	g.Expect(e.c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e.namespace,
		Labels: map[string]string{"e2e.sharder.dev/ring": e.ring}}})).To(gomega.Succeed())
	g.Expect(localrun.EnsureNamespace(ctx, e.c, e.leaseNamespace)).To(gomega.Succeed())

	var err error
	if opts.ServiceAccounts {
		e.addServiceAccountUsers()
	} else {
		e.instanceUser, err = cluster.ControlPlane.AddServiceAccountUser(e.ring+"-instance", e.leaseNamespace, instanceAccount)
		g.Expect(err).NotTo(gomega.HaveOccurred())
	}

	drain := metav1.Duration{Duration: opts.DrainTimeout}
	r := &sharderv1alpha1.ControllerRing{
		ObjectMeta: metav1.ObjectMeta{Name: e.ring},
		Spec: sharderv1alpha1.ControllerRingSpec{
			LeaseNamespace:          e.leaseNamespace,
			Resources:               opts.Resources,
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"e2e.sharder.dev/ring": e.ring}},
			DrainTimeout:            &drain,
			InstanceServiceAccounts: []sharderv1alpha1.ServiceAccountReference{{Namespace: e.leaseNamespace, Name: instanceAccount}},
		},
	}
	if opts.Slots > 0 {
		r.Spec.Assignment = &sharderv1alpha1.RingAssignment{Unit: sharderv1alpha1.AssignmentUnitSlots,
			Slots: &sharderv1alpha1.RingSlots{Count: int32(opts.Slots)}}
	}
	if opts.FailurePolicy != "" {
		r.Spec.Webhook = &sharderv1alpha1.RingWebhook{FailurePolicy: &opts.FailurePolicy}
	}
	g.Expect(e.c.Create(ctx, r)).To(gomega.Succeed())

	e.tracker, err = localrun.NewLabelWatch(cluster.ControlPlane.Config, opts.Watched, e.namespace, e.ring)
	g.Expect(err).NotTo(gomega.HaveOccurred())
	g.Expect(e.tracker.Start(ctx)).To(gomega.Succeed())
	return e
}

// addServiceAccountUsers provisions the instances' and the sharder's
// identities as their ServiceAccounts' tokens give them (the user name and
// the groups system:serviceaccounts and system:serviceaccounts:<namespace>,
// no system:masters), bound to cluster-admin until the test ends.
func (e *ringEnv) addServiceAccountUsers() {
	e.t.Helper()
	g := e.g
	g.Expect(localrun.EnsureNamespace(e.ctx, e.c, e.sharderNamespace)).To(gomega.Succeed())
	var err error
	e.instanceUser, err = cluster.ControlPlane.AddUser(e.ring+"-instance", localrun.ServiceAccountUser(e.leaseNamespace, instanceAccount),
		"system:serviceaccounts", "system:serviceaccounts:"+e.leaseNamespace)
	g.Expect(err).NotTo(gomega.HaveOccurred())
	e.sharderUser, err = cluster.ControlPlane.AddUser(e.ring+"-sharder", localrun.ServiceAccountUser(e.sharderNamespace, sharderAccount),
		"system:serviceaccounts", "system:serviceaccounts:"+e.sharderNamespace)
	g.Expect(err).NotTo(gomega.HaveOccurred())
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: e.ring + "-accounts"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects: []rbacv1.Subject{
			{Kind: rbacv1.ServiceAccountKind, Namespace: e.leaseNamespace, Name: instanceAccount},
			{Kind: rbacv1.ServiceAccountKind, Namespace: e.sharderNamespace, Name: sharderAccount},
		},
	}
	g.Expect(e.c.Create(e.ctx, binding)).To(gomega.Succeed())
	e.accounts = binding
}

// startSharders starts the configured number of sharder replicas and waits
// until one of them leads.
func (e *ringEnv) startSharders() {
	e.t.Helper()
	for i := range e.opts.Sharders {
		e.startSharder(fmt.Sprintf("%s-sharder-%d", e.ring, i))
	}
	e.leader()
}

func (e *ringEnv) startSharder(name string) *localrun.Sharder {
	e.t.Helper()
	opts := localrun.SharderOptions{Name: name, Namespace: e.sharderNamespace, Restart: instanceRestart,
		LeaderLeaseDuration: e.opts.LeaderLeaseDuration}
	if e.sharderUser != nil {
		opts.Kubeconfig = e.sharderUser.Kubeconfig
	}
	s, err := cluster.StartSharder(e.ctx, opts)
	e.g.Expect(err).NotTo(gomega.HaveOccurred())
	e.procs.Add(s.Process)
	e.mu.Lock()
	e.sharders = append(e.sharders, s)
	e.mu.Unlock()
	return s
}

// leader waits until exactly one running replica says it leads and
// returns it.
func (e *ringEnv) leader() *localrun.Sharder {
	e.t.Helper()
	var leader *localrun.Sharder
	e.g.Eventually(func() error {
		leader = nil
		for _, s := range e.liveSharders() {
			if localrun.IsLeader(s) {
				if leader != nil {
					return fmt.Errorf("both %s and %s lead", leader.Name, s.Name)
				}
				leader = s
			}
		}
		if leader == nil {
			return fmt.Errorf("no sharder replica leads yet")
		}
		return nil
	}).WithTimeout(time.Minute).WithPolling(200 * time.Millisecond).Should(gomega.Succeed())
	return leader
}

func (e *ringEnv) liveSharders() []*localrun.Sharder {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []*localrun.Sharder
	for _, s := range e.sharders {
		if !s.Exited() {
			out = append(out, s)
		}
	}
	return out
}

// startInstance starts an operator instance with identity id and waits
// until it holds its Lease.
func (e *ringEnv) startInstance(id string) *localrun.Process {
	e.t.Helper()
	return e.startInstanceWithLease(id, e.opts.LeaseDuration)
}

// startInstances starts n operator instances, instance-0 to instance-<n-1>,
// all at once (as a StatefulSet of parallel pod management does), and
// waits until each holds its Lease. A new instance creates its Lease one
// lease duration after it starts: started together, they wait that long
// once, not n times.
func (e *ringEnv) startInstances(n int) {
	e.t.Helper()
	procs := make([]*localrun.Process, n)
	for i := range n {
		procs[i] = e.launchInstance(fmt.Sprintf("instance-%d", i), e.opts.LeaseDuration)
	}
	for i, p := range procs {
		e.waitHeld(fmt.Sprintf("instance-%d", i), p)
	}
}

// startInstanceWithLease is startInstance with a lease duration of the
// instance's own. A new instance creates its Lease one lease duration after
// it starts, so this also bounds how long the start takes.
func (e *ringEnv) startInstanceWithLease(id string, leaseDuration time.Duration) *localrun.Process {
	e.t.Helper()
	p := e.launchInstance(id, leaseDuration)
	e.waitHeld(id, p)
	return p
}

// launchInstance starts the process of instance id without waiting for it.
func (e *ringEnv) launchInstance(id string, leaseDuration time.Duration) *localrun.Process {
	e.t.Helper()
	path := cluster.Binaries.Operator
	if e.opts.InstanceBinary != "" {
		path = e.opts.InstanceBinary
	}
	p, err := cluster.Start(localrun.ProcessOptions{
		Name: e.ring + "-" + id, Path: path,
		Args:    operatorArgs(e, id, leaseDuration),
		Env:     []string{"POD_NAME=" + id, "POD_NAMESPACE=" + e.leaseNamespace},
		Restart: instanceRestart,
	})
	e.g.Expect(err).NotTo(gomega.HaveOccurred())
	e.procs.Add(p)
	e.setInstance(id, p)
	return p
}

// setInstance makes p instance id's process, keeping the one it replaces
// among the ID's earlier processes.
func (e *ringEnv) setInstance(id string, p *localrun.Process) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if prev := e.instances[id]; prev != nil && prev != p {
		e.earlier[id] = append(e.earlier[id], prev)
	}
	e.instances[id] = p
}

// waitHeld waits until instance id holds its Lease; the processes holding
// it must not be stopped for good meanwhile (they may be restarted).
func (e *ringEnv) waitHeld(id string, procs ...*localrun.Process) {
	e.t.Helper()
	e.g.Eventually(func() error {
		for _, p := range procs {
			if p.Exited() {
				return gomega.StopTrying(fmt.Sprintf("%s exited: %v", p.Name, p.ExitError()))
			}
		}
		var lease coordinationv1.Lease
		if err := e.c.Get(e.ctx, client.ObjectKey{Namespace: e.leaseNamespace, Name: id}, &lease); err != nil {
			return fmt.Errorf("%w%s", err, restarts(procs))
		}
		if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != id {
			return fmt.Errorf("lease %s not held by its instance%s", id, restarts(procs))
		}
		return nil
	}).WithTimeout(time.Minute).WithPolling(100 * time.Millisecond).Should(gomega.Succeed())
}

// restarts says which of procs were restarted, and how their last run
// ended; "" if none was.
func restarts(procs []*localrun.Process) string {
	var out []string
	for _, p := range procs {
		if n := p.Restarts(); n > 0 {
			exits := p.Exits()
			out = append(out, fmt.Sprintf("%s restarted %d times, last exit: %v", p.Name, n, exits[len(exits)-1].Err))
		}
	}
	if len(out) == 0 {
		return ""
	}
	return " (" + strings.Join(out, "; ") + ")"
}

// reconcileLog is the path of an instance's reconcile log.
func (e *ringEnv) reconcileLog(id string) string {
	return filepath.Join(e.reconcileLogs, id+".jsonl")
}

// stopInstance stops an instance gracefully (SIGTERM) and for good, as a
// scale-in does, and expects a clean exit.
func (e *ringEnv) stopInstance(id string) {
	e.t.Helper()
	e.g.Expect(e.instance(id).Stop(30 * time.Second)).To(gomega.Succeed())
}

// killInstance kills an instance with SIGKILL, for good: it is not
// restarted, as when its node dies and its pod is not replaced. (An
// instance killed with e.instance(id).Signal(syscall.SIGKILL) is
// restarted, as a crashed container is.)
func (e *ringEnv) killInstance(id string) {
	e.t.Helper()
	e.g.Expect(e.instance(id).Kill()).To(gomega.Succeed())
}

func (e *ringEnv) instance(id string) *localrun.Process {
	e.mu.Lock()
	defer e.mu.Unlock()
	p, ok := e.instances[id]
	if !ok {
		e.t.Fatalf("no instance %s", id)
	}
	return p
}

// liveInstances returns the IDs of the instances not ended for good
// (running, or waiting to be restarted), sorted.
func (e *ringEnv) liveInstances() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var ids []string
	for id, p := range e.instances {
		if !p.Exited() {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids
}

// restartCounts returns how many times each restarted instance process
// was restarted, by its process name.
func (e *ringEnv) restartCounts() map[string]int {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := map[string]int{}
	for _, ps := range []map[string]*localrun.Process{e.instances, e.agents} {
		for _, p := range ps {
			if n := p.Restarts(); n > 0 {
				out[p.Name] = n
			}
		}
	}
	return out
}

// stopAll stops instances and agents first (so they release their Leases
// while the sharder still runs), then the sharders.
func (e *ringEnv) stopAll() {
	e.mu.Lock()
	instances := make([]*localrun.Process, 0, len(e.instances)+len(e.agents))
	for _, p := range e.instances {
		instances = append(instances, p)
	}
	for _, p := range e.agents {
		instances = append(instances, p)
	}
	sharders := append([]*localrun.Sharder(nil), e.sharders...)
	e.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range instances {
		wg.Add(1)
		go func() { defer wg.Done(); _ = p.Stop(15 * time.Second) }()
	}
	wg.Wait()
	for _, s := range sharders {
		wg.Add(1)
		go func() { defer wg.Done(); _ = s.Stop(15 * time.Second) }()
	}
	wg.Wait()
}

// newCluster returns an EtcdCluster of the scenario's namespace.
func (e *ringEnv) newCluster(name string) *etcdv1alpha1.EtcdCluster {
	return &etcdv1alpha1.EtcdCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.namespace, Name: name},
		Spec:       etcdv1alpha1.EtcdClusterSpec{Size: 1},
	}
}

// waitProtected waits until the ring's validating webhook guards the
// EtcdCluster name of the ring's namespace: a dry-run move of it to another
// instance, which changes nothing, is denied. The sharder writes a new
// ring's webhook entries on its own schedule (after its CA bundle is
// loaded, and the API server applies a changed configuration a moment
// later), so a ring settles before it is guarded; a forbidden edit made
// in that window would land.
func (e *ringEnv) waitProtected(name string, timeout time.Duration) {
	e.t.Helper()
	patch := []byte(fmt.Sprintf(`{"metadata":{"labels":{%q:"someone-else"}}}`, sharderv1alpha1.ShardLabel(e.ring)))
	e.g.Eventually(func() error {
		err := e.c.Patch(e.ctx, e.newCluster(name), client.RawPatch(types.MergePatchType, patch), client.DryRunAll)
		switch {
		case err == nil:
			return fmt.Errorf("a dry-run move of %s was allowed", name)
		case !isDenied(err):
			return fmt.Errorf("a dry-run move of %s: want a denial: %w", name, err)
		}
		return nil
	}).WithTimeout(timeout).WithPolling(200*time.Millisecond).Should(gomega.Succeed(), "ring %s's validating webhook guards its objects", e.ring)
}

// createClusters creates n EtcdClusters named prefix-<i>.
func (e *ringEnv) createClusters(prefix string, n int) []string {
	e.t.Helper()
	keys := make([]string, n)
	for i := range n {
		obj := e.newCluster(fmt.Sprintf("%s-%03d", prefix, i))
		e.g.Expect(e.c.Create(e.ctx, obj)).To(gomega.Succeed())
		keys[i] = e.namespace + "/" + obj.Name
	}
	return keys
}

// waitSettled waits until n tracked objects (EtcdClusters unless the
// scenario says otherwise) sit on the instances the ring of the given
// instances (default: the running ones) chooses, none draining.
func (e *ringEnv) waitSettled(n int, timeout time.Duration, instances ...string) localrun.Assignment {
	e.t.Helper()
	if len(instances) == 0 {
		instances = e.liveInstances()
	}
	ctx, cancel := context.WithTimeout(e.ctx, timeout)
	defer cancel()
	if err := e.tracker.Wait(ctx, localrun.SettledOn(e.opts.TrackedKind, n, instances...)); err != nil {
		e.t.Fatalf("%s of ring %s did not settle on %v within %s: %v", e.opts.Watched.Resource, e.ring, instances, timeout, err)
	}
	return e.tracker.Assignment()
}

// records reads every instance's reconcile log.
func (e *ringEnv) records() []reconcilelog.Entry {
	e.t.Helper()
	var all []reconcilelog.Entry
	entries, err := os.ReadDir(e.reconcileLogs)
	e.g.Expect(err).NotTo(gomega.HaveOccurred())
	for _, entry := range entries {
		recs, err := reconcilelog.Read(filepath.Join(e.reconcileLogs, entry.Name()))
		e.g.Expect(err).NotTo(gomega.HaveOccurred())
		all = append(all, recs...)
	}
	return all
}

// intervals pairs the reconcile records; a reconcile left open by a killed
// instance lasts until the exit of the run of its process that started it.
func (e *ringEnv) intervals() []reconcilelog.Interval {
	exits := map[string][]time.Time{}
	e.mu.Lock()
	for id, p := range e.instances {
		for _, q := range append(slices.Clone(e.earlier[id]), p) {
			for _, x := range q.Exits() {
				exits[id] = append(exits[id], x.Time)
			}
		}
	}
	e.mu.Unlock()
	return reconcilelog.Intervals(e.records(), exits, time.Now())
}

// expectNoOverlap fails the test if two instances ever reconciled one
// object at the same time.
func (e *ringEnv) expectNoOverlap() []reconcilelog.Interval {
	e.t.Helper()
	ivs := e.intervals()
	overlaps := reconcilelog.Overlaps(ivs)
	if len(overlaps) > 0 {
		msgs := make([]string, 0, len(overlaps))
		for _, o := range overlaps {
			msgs = append(msgs, o.String())
		}
		e.t.Fatalf("%d overlapping reconciles:\n%s", len(overlaps), strings.Join(msgs, "\n"))
	}
	return ivs
}

// expectReconciledByOwner waits until every EtcdCluster's current
// generation has been reconciled to the end by the instance it is
// assigned to.
func (e *ringEnv) expectReconciledByOwner(timeout time.Duration) {
	e.t.Helper()
	e.g.Eventually(func() error {
		last := reconcilelog.LastReconcile(e.intervals())
		var bad []string
		for _, o := range e.tracker.Snapshot() {
			iv, ok := last[o.Key]
			switch {
			case !ok:
				bad = append(bad, o.Key+" never reconciled")
			case iv.Instance != o.Instance:
				bad = append(bad, fmt.Sprintf("%s last reconciled by %s, assigned to %s", o.Key, iv.Instance, o.Instance))
			case iv.Error != "":
				bad = append(bad, fmt.Sprintf("%s: last reconcile failed: %s", o.Key, iv.Error))
			case iv.Generation < o.Generation:
				bad = append(bad, fmt.Sprintf("%s last reconciled at generation %d, now %d", o.Key, iv.Generation, o.Generation))
			}
		}
		if len(bad) > 0 {
			n := len(bad)
			bad = bad[:min(n, 5)]
			return fmt.Errorf("%d objects not reconciled after their last change: %s", n, strings.Join(bad, "; "))
		}
		return nil
	}).WithTimeout(timeout).WithPolling(250 * time.Millisecond).Should(gomega.Succeed())
}

// lease reads an instance's Lease.
func (e *ringEnv) lease(id string) *coordinationv1.Lease {
	e.t.Helper()
	var l coordinationv1.Lease
	e.g.Expect(e.c.Get(e.ctx, client.ObjectKey{Namespace: e.leaseNamespace, Name: id}, &l)).To(gomega.Succeed())
	return &l
}

// deleteLease deletes a running instance's Lease, as `kubectl delete lease`
// does, or the garbage collector after `kubectl delete pod --force`.
func (e *ringEnv) deleteLease(id string) {
	e.t.Helper()
	e.g.Expect(e.c.Delete(e.ctx, e.lease(id))).To(gomega.Succeed())
}

// unlabelLease removes the ring label from a running instance's Lease.
func (e *ringEnv) unlabelLease(id string) {
	e.t.Helper()
	patch := []byte(`{"metadata":{"labels":{"` + sharderv1alpha1.LabelRing + `":null}}}`)
	e.g.Expect(e.c.Patch(e.ctx, e.lease(id), client.RawPatch(types.MergePatchType, patch))).To(gomega.Succeed())
}

// ignoreGone treats a deleted object as success.
func ignoreGone(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// metav1ControllerOf returns the name of obj's controller, "" if none.
func metav1ControllerOf(obj client.Object) string {
	if ref := metav1.GetControllerOf(obj); ref != nil {
		return ref.Name
	}
	return ""
}

// operatorArgs is the example operator's command line for instance id.
func operatorArgs(e *ringEnv, id string, leaseDuration time.Duration) []string {
	return []string{
		"--kubeconfig", e.instanceUser.Kubeconfig,
		"--ring", e.ring,
		"--lease-namespace", e.leaseNamespace,
		"--instance", id,
		"--lease-duration", leaseDuration.String(),
		"--reconcile-log", e.reconcileLog(id),
		"--metrics-bind-address", "0",
		"--health-probe-bind-address", "0",
	}
}
