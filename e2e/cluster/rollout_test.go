package cluster

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/sharder-dev/sharder/internal/localrun"
	"github.com/sharder-dev/sharder/internal/reconcilelog"
	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
)

// restartSlack is how much longer than its pod's restart an instance's
// objects may go without a reconciling instance on a rolling update: the
// time its new process takes, once its container has started, to acquire
// the Lease its old process handed back. More means the new process waited
// for something (a lease duration, the end of the ring's restartHold).
const restartSlack = 2 * time.Second

// A rolling update of a StatefulSet whose instances hand their Leases back
// with --release=Restart moves no object: for the ring's restartHold the
// sharder keeps the objects of an instance that is restarting where they
// are, and the new pod of the same name acquires the Lease as soon as it is
// up (`sharder agent`: as soon as its controller answers). Two views
// measure it:
//
//   - moves: every value the shard and drain labels of the ring's objects
//     took, as a watch saw them (labelRecorder); none may change from the
//     start of the rollout until the check;
//   - per pod, from the pod and Lease watches (rolloutRecorder): stopped,
//     when the old pod was seen terminating or its instance released the
//     Lease, whichever came first: from then on the old instance admits no
//     reconcile (the kubelet has sent SIGTERM, and the release comes after
//     the last reconcile); started, when the new pod's last container
//     started; acquired, the acquireTime the new instance wrote taking the
//     Lease. The pod's restart is started - stopped: what Kubernetes takes
//     to stop the old pod, delete it, create, schedule and start the new
//     one, whatever the instances do. The gap, the time its objects had no
//     reconciling instance, is acquired - stopped. The kubelet reports a
//     container's start in whole seconds, so started is taken at the end of
//     the reported second, the latest it may have been.
//
// Readiness would not do as the end of a restart: the pod is Ready only
// once its instance holds the Lease, so a new process that waited for its
// Lease would lengthen its restart just as much as the gap.

// rolloutRecorder watches the pods of a StatefulSet of instances and the
// Leases in their namespace, and remembers, with when it saw it, what a
// rolling update is measured by.
type rolloutRecorder struct {
	namespace, app string

	mu     sync.Mutex
	pods   map[types.UID]*podSeen
	leases map[string][]leaseSeen
}

// podSeen is what the recorder saw of one pod.
type podSeen struct {
	name string
	// stopping is when the pod was first seen terminating, gone when it was
	// seen deleted, ready when it was first seen Ready.
	stopping, gone, ready time.Time
	// started is when the last of its containers to start started, as the
	// kubelet reports it (whole seconds).
	started time.Time
}

// leaseSeen is one version of a Lease, or its deletion, as the recorder saw
// it.
type leaseSeen struct {
	at         time.Time
	uid        types.UID
	deleted    bool
	holder     string
	restarting bool
	owner      types.UID // the Pod the Lease belongs to
	renew      time.Time
	acquire    time.Time
}

// newRolloutRecorder watches the pods labelled app.kubernetes.io/name=app
// and the Leases of namespace until ctx ends.
func newRolloutRecorder(ctx context.Context, t *testing.T, namespace, app string) *rolloutRecorder {
	cs, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		t.Fatal(err)
	}
	r := &rolloutRecorder{namespace: namespace, app: app, pods: map[types.UID]*podSeen{}, leases: map[string][]leaseSeen{}}
	factory := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(namespace))
	pods := factory.Core().V1().Pods().Informer()
	if _, err := pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { r.observePod(obj, app, false) },
		UpdateFunc: func(_, obj any) { r.observePod(obj, app, false) },
		DeleteFunc: func(obj any) { r.observePod(obj, app, true) },
	}); err != nil {
		t.Fatal(err)
	}
	leases := factory.Coordination().V1().Leases().Informer()
	if _, err := leases.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { r.observeLease(obj, false) },
		UpdateFunc: func(_, obj any) { r.observeLease(obj, false) },
		DeleteFunc: func(obj any) { r.observeLease(obj, true) },
	}); err != nil {
		t.Fatal(err)
	}
	factory.Start(ctx.Done())
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			t.Fatalf("the rollout recorder's watch of %v did not sync", typ)
		}
	}
	return r
}

func (r *rolloutRecorder) observePod(obj any, app string, deleted bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	p, ok := obj.(*corev1.Pod)
	if !ok || p.Labels["app.kubernetes.io/name"] != app {
		return
	}
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.pods[p.UID]
	if s == nil {
		s = &podSeen{name: p.Name}
		r.pods[p.UID] = s
	}
	if p.DeletionTimestamp != nil && s.stopping.IsZero() {
		s.stopping = now
	}
	if deleted && s.gone.IsZero() {
		s.gone = now
	}
	for _, c := range slices.Concat(p.Status.InitContainerStatuses, p.Status.ContainerStatuses) {
		if c.State.Running != nil && c.State.Running.StartedAt.After(s.started) {
			s.started = c.State.Running.StartedAt.Time
		}
	}
	if s.ready.IsZero() && slices.ContainsFunc(p.Status.Conditions, func(c corev1.PodCondition) bool {
		return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
	}) {
		s.ready = now
	}
}

func (r *rolloutRecorder) observeLease(obj any, deleted bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	l, ok := obj.(*coordinationv1.Lease)
	if !ok {
		return
	}
	seen := leaseSeen{at: time.Now(), uid: l.UID, deleted: deleted, holder: ptr.Deref(l.Spec.HolderIdentity, "")}
	_, seen.restarting = l.Annotations[sharderv1alpha1.AnnotationRestarting]
	for _, ref := range l.OwnerReferences {
		if ref.APIVersion == "v1" && ref.Kind == "Pod" {
			seen.owner = ref.UID
		}
	}
	if l.Spec.RenewTime != nil {
		seen.renew = l.Spec.RenewTime.Time
	}
	if l.Spec.AcquireTime != nil {
		seen.acquire = l.Spec.AcquireTime.Time
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.leases[l.Name] = append(r.leases[l.Name], seen)
}

// podRestart is what a rolling update did to one instance: its pod replaced
// by a new one of the same name. See the top of this file for the times.
type podRestart struct {
	instance                   string
	stopped, released, oldGone time.Time
	started, acquired, ready   time.Time
	// restarting says that the old instance handed its Lease back marked as
	// restarting (sharder.dev/restarting).
	restarting bool
	// leaseDeleted is when the Lease was seen deleted between the release
	// and the acquisition (the new instance then created it anew), zero if
	// it was not.
	leaseDeleted time.Time
	// states are the states the ring's status showed for the instance from
	// the old pod's stop until it was ready again.
	states []string
}

func (p podRestart) restart() time.Duration { return p.started.Sub(p.stopped) }
func (p podRestart) gap() time.Duration     { return p.acquired.Sub(p.stopped) }

func (p podRestart) String() string {
	since := func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.Sub(p.stopped).Round(10 * time.Millisecond).String()
	}
	return fmt.Sprintf("%-18s restart %-7s gap %-7s | released %-7s old pod gone %-7s Lease deleted %-7s new pod started %-7s Lease acquired %-7s Ready %-7s | ring states %v",
		p.instance, since(p.started), since(p.acquired), since(p.released), since(p.oldGone), since(p.leaseDeleted), since(p.started), since(p.acquired), since(p.ready),
		p.states)
}

// restarts returns what the rolling update that replaced the pods old by
// replaced (UIDs by pod name, the instance ID) did to each instance.
func (r *rolloutRecorder) restarts(g Gomega, old, replaced map[string]types.UID) []podRestart {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []podRestart
	for _, name := range slices.Sorted(maps.Keys(old)) {
		o, n := r.pods[old[name]], r.pods[replaced[name]]
		g.Expect(o).NotTo(BeNil(), "the old pod %s was not seen", name)
		g.Expect(n).NotTo(BeNil(), "the new pod %s was not seen", name)
		g.Expect(o.stopping).NotTo(BeZero(), "the old pod %s was not seen terminating", name)
		g.Expect(n.started).NotTo(BeZero(), "the new pod %s was not seen started", name)
		p := podRestart{instance: name, stopped: o.stopping, oldGone: o.gone, ready: n.ready,
			started: n.started.Add(time.Second)}
		// The old pod's last renewal, its release (the holder emptied), and
		// the new pod's acquisition, in the order the watch delivered them.
		history := r.leases[name]
		renewed := slices.IndexFunc(history, func(l leaseSeen) bool { return l.owner == old[name] && l.holder == name })
		g.Expect(renewed).NotTo(Equal(-1), "the old pod of %s (%s) was not seen holding its Lease:\n%s", name, old[name], formatLeaseHistory(history))
		for renewed+1 < len(history) && history[renewed+1].owner == old[name] && history[renewed+1].holder == name {
			renewed++
		}
		release := index(history, renewed+1, func(l leaseSeen) bool { return !l.deleted && l.holder == "" })
		g.Expect(release).NotTo(Equal(-1), "the old pod of %s (%s) did not release its Lease:\n%s", name, old[name], formatLeaseHistory(history))
		p.released, p.restarting = history[release].renew, history[release].restarting
		p.stopped = earliest(p.stopped, p.released)
		acquired := index(history, release+1, func(l leaseSeen) bool { return l.owner == replaced[name] && l.holder == name })
		g.Expect(acquired).NotTo(Equal(-1), "the new pod of %s (%s) did not acquire its Lease after the release:\n%s", name, replaced[name], formatLeaseHistory(history))
		p.acquired = history[acquired].acquire
		if i := slices.IndexFunc(history[release:acquired], func(l leaseSeen) bool { return l.deleted }); i != -1 {
			p.leaseDeleted = history[release+i].at
		}
		out = append(out, p)
	}
	return out
}

// releasedSince returns the first hand-back of the Lease of instance (its
// holder emptied) the recorder saw from since on.
func (r *rolloutRecorder) releasedSince(instance string, since time.Time) (leaseSeen, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, l := range r.leases[instance] {
		if !l.at.Before(since) && !l.deleted && l.holder == "" {
			return l, true
		}
	}
	return leaseSeen{}, false
}

// leaseHistory formats what the recorder saw of the Lease of instance.
func (r *rolloutRecorder) leaseHistory(instance string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return formatLeaseHistory(r.leases[instance])
}

func formatLeaseHistory(history []leaseSeen) string {
	var b strings.Builder
	for _, l := range history {
		fmt.Fprintf(&b, "  %s uid %s deleted %t holder %q restarting %t owner %s renew %s acquire %s\n", l.at.Format(time.StampMilli),
			l.uid, l.deleted, l.holder, l.restarting, l.owner, l.renew.Format(time.StampMicro), l.acquire.Format(time.StampMicro))
	}
	return b.String()
}

// dumpLeaseLogs logs what the pods' containers logged about their Leases.
func (r *rolloutRecorder) dumpLeaseLogs(t *testing.T) {
	out, err := kubectl(context.Background(), "logs", "--namespace", r.namespace, "-l", "app.kubernetes.io/name="+r.app,
		"--all-containers", "--prefix", "--timestamps", "--tail=-1")
	var lines []string
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "Lease") {
			lines = append(lines, line)
		}
	}
	t.Logf("what the pods of %s logged about their Leases (%v):\n%s", r.app, err, strings.Join(lines, "\n"))
}

// index returns the index of the first element of s from from on that
// satisfies f, -1 if none does.
func index[S ~[]E, E any](s S, from int, f func(E) bool) int {
	if i := slices.IndexFunc(s[min(from, len(s)):], f); i != -1 {
		return from + i
	}
	return -1
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// rollout is a rolling update to check: the objects' assignment before it,
// when it started, and the pods it replaced (old) by new ones (replaced).
type rollout struct {
	before        localrun.Assignment
	start         time.Time
	old, replaced map[string]types.UID
	// slack is how much longer than its pod's restart an object may be
	// without a reconciling instance: restartSlack, and whatever the
	// instances add by design.
	slack time.Duration
	// logs is the folder of the pods' reconcile logs.
	logs   string
	labels *labelRecorder
	states *ringStateRecorder
	pods   *rolloutRecorder
}

// expectNoMoves checks that a rolling update of instances that hand their
// Leases back for a restart moved nothing and left no object without a
// reconciling instance for longer than its pod's restart and ro.slack,
// and logs the figures: the objects moved, each pod's restart and gap, and
// the longest gap of any object, from the Leases and from the reconcile
// logs (from the old pod's stop to the new pod's first reconcile of it).
func expectNoMoves(t *testing.T, g Gomega, ro rollout) {
	t.Helper()
	t.Cleanup(func() {
		if t.Failed() {
			ro.pods.dumpLeaseLogs(t)
		}
	})
	// Every change of an object's shard label is a move (to no instance
	// when the sharder released it), and every drain label a request.
	var moves, drains []string
	moved := 0
	for _, o := range ro.before {
		changes := ro.labels.changesSince(o.Key, ro.start)
		shard := shardChanges(changes, o.Instance)
		if len(shard) > 0 {
			moved++
		}
		from := o.Instance
		for _, c := range shard {
			moves = append(moves, fmt.Sprintf("%s: %q to %q at %s", o.Key, from, c.Instance, c.At.Format(time.StampMilli)))
			from = c.Instance
		}
		for _, c := range changes {
			if c.Drain != "" {
				drains = append(drains, fmt.Sprintf("%s: drain to %q at %s", o.Key, c.Drain, c.At.Format(time.StampMilli)))
			}
		}
	}
	restarts := ro.pods.restarts(g, ro.old, ro.replaced)
	byInstance := map[string]podRestart{}
	lines := make([]string, 0, len(restarts))
	for i, p := range restarts {
		for _, c := range ro.states.since(p.instance, p.stopped) {
			p.states = append(p.states, c.State)
			if c.State == string(membership.StateReady) {
				break
			}
		}
		restarts[i] = p
		byInstance[p.instance] = p
		lines = append(lines, "  "+p.String())
	}

	// The objects' own view: from the old pod's stop to the new pod's first
	// reconcile of the object (it reconciles all of its objects on start).
	firstByNew := map[string]time.Time{}
	g.Eventually(func(g Gomega) {
		for _, o := range ro.before {
			if _, ok := firstByNew[o.Key]; ok {
				continue
			}
			recs, err := reconcilelog.Read(filepath.Join(ro.logs, fmt.Sprintf("%s_%s.jsonl", o.Instance, ro.replaced[o.Instance])))
			g.Expect(err).NotTo(HaveOccurred())
			i := slices.IndexFunc(recs, func(r reconcilelog.Entry) bool {
				return r.Object == o.Key && r.Phase == reconcilelog.PhaseStart
			})
			g.Expect(i).NotTo(Equal(-1), "%s not reconciled by the new pod of %s yet", o.Key, o.Instance)
			firstByNew[o.Key] = recs[i].Time
		}
	}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
	var longest, longestLogged struct {
		key string
		d   time.Duration
	}
	for _, o := range ro.before {
		p := byInstance[o.Instance]
		if d := p.gap(); d > longest.d {
			longest.key, longest.d = o.Key, d
		}
		if d := firstByNew[o.Key].Sub(p.stopped); d > longestLogged.d {
			longestLogged.key, longestLogged.d = o.Key, d
		}
	}
	t.Logf("rolling update of %d pods: %d of %d objects moved (%d moves), %d drain requests; longest without a reconciling instance %s (%s, "+
		"from its old pod's stop to its new pod's Lease); to the new pod's first reconcile of it %s (%s)\n"+
		"per pod, from the old pod's stop:\n%s",
		len(restarts), moved, len(ro.before), len(moves), len(drains), longest.d.Round(10*time.Millisecond), longest.key,
		longestLogged.d.Round(10*time.Millisecond), longestLogged.key, strings.Join(lines, "\n"))

	g.Expect(ro.labels.brokenSince(ro.start)).To(BeEmpty(), "the label watch broke during the rollout: a move may have been missed")
	g.Expect(moves).To(BeEmpty(), "objects moved during the rolling update")
	g.Expect(drains).To(BeEmpty(), "objects were asked to drain during the rolling update")
	for _, p := range restarts {
		g.Expect(p.restarting).To(BeTrue(), "%s handed its Lease back without %s", p.instance, sharderv1alpha1.AnnotationRestarting)
		g.Expect(p.states).To(Or(BeEmpty(), HaveEach(BeElementOf(string(membership.StateReady), string(membership.StateRestarting)))),
			"the ring showed %s in another state than restarting while its pod restarted", p.instance)
		g.Expect(p.gap()).To(BeNumerically("<=", p.restart()+ro.slack),
			"%s had no reconciling instance for %s, longer than its pod's restart (%s) and %s", p.instance,
			p.gap().Round(10*time.Millisecond), p.restart().Round(10*time.Millisecond), ro.slack)
	}
}

// shardChanges returns the changes among changes that changed the shard
// label, which was from before the first.
func shardChanges(changes []labelChange, from string) []labelChange {
	var out []labelChange
	for _, c := range changes {
		if c.Instance != from {
			out = append(out, c)
			from = c.Instance
		}
	}
	return out
}
