package controller_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	etcdv1alpha1 "github.com/sharder-dev/sharder/examples/etcd-operator/api/v1alpha1"
	"github.com/sharder-dev/sharder/examples/etcd-operator/internal/controller"
	"github.com/sharder-dev/sharder/examples/etcd-operator/internal/etcdtest"
)

// memberPods plays the StatefulSet controller and the kubelet for one
// cluster, with real etcd processes: it creates the pods the StatefulSet's
// replicas ask for from its template (behind the membership gate) and
// deletes the ones above; it starts a pod's etcd member once the operator
// lets the pod start, with the initial cluster the operator wrote on it,
// stops it when its pod goes (wiping its data with ephemeral storage), and
// reports readiness from the member's /health.
type memberPods struct {
	t         *testing.T
	local     *etcdtest.Cluster
	ns, name  string
	ephemeral bool

	mu sync.Mutex
	// started: the pod UID each member's process was started for.
	started map[string]types.UID
	// paused: the StatefulSet controller creates no pod.
	paused bool
	// down: members the test stopped under their running pods, which the
	// kubelet leaves stopped (any other member that exits, it starts again,
	// as it restarts a container).
	down map[string]bool
	// deletions: each pod deletion seen, with what was true at that time.
	deletions []podDeletion
}

// podDeletion is a member pod going, as the kubelet saw it.
type podDeletion struct {
	pod string
	// othersReady is the number of the other member pods that were ready.
	othersReady int
	// listed: etcd still listed the member when its pod went.
	listed bool
}

func newMemberPods(t *testing.T, ns, name string, ephemeral bool) *memberPods {
	p := &memberPods{t: t, local: etcdtest.New(t), ns: ns, name: name, ephemeral: ephemeral, started: map[string]types.UID{}, down: map[string]bool{}}
	t.Cleanup(func() {
		if t.Failed() {
			for _, m := range p.local.Members() {
				t.Logf("log of etcd member %s (running: %t):\n%s", m.Name, m.Running(), m.LogTail(4000))
			}
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				if err := p.sync(ctx); err != nil && ctx.Err() == nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
					t.Logf("playing the pods of %s: %v", name, err)
				}
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return p
}

// member returns the local member of a pod, made on first use.
func (p *memberPods) member(pod string) *etcdtest.Member {
	p.mu.Lock()
	defer p.mu.Unlock()
	if m := p.local.Member(pod); m != nil {
		return m
	}
	m, err := p.local.Add(pod)
	if err != nil {
		p.t.Errorf("adding member %s: %v", pod, err)
		return &etcdtest.Member{Name: pod}
	}
	return m
}

func (p *memberPods) ours(c *etcdv1alpha1.EtcdCluster) bool {
	return c.Namespace == p.ns && c.Name == p.name
}

// options point the operator at the local members: their peer URLs, and
// the client URLs of the members whose pods run.
func (p *memberPods) options() controller.Options {
	return controller.Options{
		PeerURL: func(c *etcdv1alpha1.EtcdCluster, i int32) string {
			if !p.ours(c) {
				return fmt.Sprintf("http://%s-%d.invalid:2380", c.Name, i)
			}
			return p.member(fmt.Sprintf("%s-%d", c.Name, i)).PeerURL
		},
		Endpoints: func(c *etcdv1alpha1.EtcdCluster, pods []corev1.Pod) []string {
			if !p.ours(c) {
				return nil
			}
			var out []string
			for _, pod := range pods {
				if pod.DeletionTimestamp == nil && len(pod.Spec.SchedulingGates) == 0 {
					out = append(out, p.member(pod.Name).ClientURL)
				}
			}
			return out
		},
		ProgressInterval: 200 * time.Millisecond,
	}
}

// startManager runs an operator for the cluster's namespace only (so that
// the tests of membership run in parallel) until the test ends or stop.
func (p *memberPods) startManager(t *testing.T) (stop func()) {
	_, stop = startManager(t, p.options(), ctrl.Options{Cache: cache.Options{DefaultNamespaces: map[string]cache.Config{p.ns: {}}}})
	return stop
}

// stopMember stops m under its running pod, as a member that hangs or
// crashes for good; the kubelet does not start it again until restartMember.
func (p *memberPods) stopMember(m *etcdtest.Member) {
	p.mu.Lock()
	p.down[m.Name] = true
	p.mu.Unlock()
	p.local.StopMember(m)
}

// restartMember starts m again on its data after stopMember.
func (p *memberPods) restartMember(m *etcdtest.Member) error {
	p.mu.Lock()
	delete(p.down, m.Name)
	p.mu.Unlock()
	return p.local.RestartMember(m)
}

func (p *memberPods) pause(paused bool) {
	p.mu.Lock()
	p.paused = paused
	p.mu.Unlock()
}

func (p *memberPods) sync(ctx context.Context) error {
	sts := &appsv1.StatefulSet{}
	if err := env().Client.Get(ctx, client.ObjectKey{Namespace: p.ns, Name: p.name}, sts); err != nil {
		return client.IgnoreNotFound(err)
	}
	list := &corev1.PodList{}
	if err := env().Client.List(ctx, list, client.InNamespace(p.ns), client.MatchingLabels{controller.LabelCluster: p.name}); err != nil {
		return err
	}
	pods := map[string]*corev1.Pod{}
	for i := range list.Items {
		pods[list.Items[i].Name] = &list.Items[i]
	}
	replicas := int(*sts.Spec.Replicas)

	// The kubelet: a member whose pod went (or was replaced) stops.
	p.mu.Lock()
	started := map[string]types.UID{}
	for k, v := range p.started {
		started[k] = v
	}
	paused := p.paused
	p.mu.Unlock()
	for name, uid := range started {
		if pod, ok := pods[name]; ok && pod.UID == uid {
			continue
		}
		p.recordDeletion(ctx, name, pods)
		m := p.member(name)
		p.local.StopMember(m)
		if p.ephemeral {
			if err := p.local.Wipe(m); err != nil {
				return err
			}
		}
		p.mu.Lock()
		delete(p.started, name)
		p.mu.Unlock()
	}

	// The StatefulSet controller.
	for name, pod := range pods {
		if ord, _ := strconv.Atoi(strings.TrimPrefix(name, p.name+"-")); ord >= replicas {
			if err := env().Client.Delete(ctx, pod); client.IgnoreNotFound(err) != nil {
				return err
			}
			delete(pods, name)
		}
	}
	for i := 0; i < replicas && !paused; i++ {
		name := fmt.Sprintf("%s-%d", p.name, i)
		if _, ok := pods[name]; ok {
			continue
		}
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{
				Namespace: p.ns, Name: name,
				Labels:      sts.Spec.Template.Labels,
				Annotations: sts.Spec.Template.Annotations,
				OwnerReferences: []metav1.OwnerReference{{
					APIVersion: "apps/v1", Kind: "StatefulSet", Name: sts.Name, UID: sts.UID, Controller: ptr.To(true),
				}},
			},
			Spec: *sts.Spec.Template.Spec.DeepCopy(),
		}
		for _, claim := range sts.Spec.VolumeClaimTemplates {
			// Stands for the claim the StatefulSet controller would make.
			pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{
				Name: claim.Name, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}},
			})
		}
		if err := env().Client.Create(ctx, pod); err != nil {
			return err
		}
		pods[name] = pod
	}

	// The kubelet: start members the operator let start, report readiness.
	ready := int32(0)
	for name, pod := range pods {
		if pod.DeletionTimestamp != nil || len(pod.Spec.SchedulingGates) > 0 || pod.UID == "" {
			continue
		}
		m := p.member(name)
		p.mu.Lock()
		uid, ok := p.started[name]
		down := p.down[name]
		p.mu.Unlock()
		switch {
		case !ok || uid != pod.UID:
			err := p.local.StartMember(m, pod.Annotations["etcd.example.sharder.dev/initial-cluster"],
				pod.Annotations["etcd.example.sharder.dev/initial-cluster-state"])
			if err != nil {
				return err
			}
			p.mu.Lock()
			p.started[name] = pod.UID
			p.mu.Unlock()
		case !down && !m.Running():
			// The container exited (a port taken between its choice and
			// etcd's listen, for one): the kubelet starts it again.
			p.t.Logf("member %s exited under its pod: starting it again", name)
			if err := p.local.RestartMember(m); err != nil {
				return err
			}
		}
		isReady := m.Running() && answersHealth(ctx, m.ClientURL)
		if isReady {
			ready++
		}
		if podIsReady(pod) != isReady {
			status := corev1.ConditionFalse
			if isReady {
				status = corev1.ConditionTrue
			}
			pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}
			if err := env().Client.Status().Update(ctx, pod); err != nil {
				return err
			}
		}
	}
	if sts.Status.ReadyReplicas != ready || sts.Status.Replicas != int32(len(pods)) {
		sts.Status.Replicas = int32(len(pods))
		sts.Status.ReadyReplicas = ready
		sts.Status.AvailableReplicas = ready
		sts.Status.ObservedGeneration = sts.Generation
		return env().Client.Status().Update(ctx, sts)
	}
	return nil
}

// recordDeletion notes what held when the pod of member name went.
func (p *memberPods) recordDeletion(ctx context.Context, name string, pods map[string]*corev1.Pod) {
	d := podDeletion{pod: name}
	for other, pod := range pods {
		if other != name && podIsReady(pod) {
			d.othersReady++
		}
	}
	if list, err := p.memberList(ctx); err == nil {
		for _, m := range list.Members {
			if m.Name == name {
				d.listed = true
			}
		}
	}
	p.mu.Lock()
	p.deletions = append(p.deletions, d)
	p.mu.Unlock()
}

func (p *memberPods) podDeletions() []podDeletion {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.deletions)
}

// client returns an etcd client to the running members.
func (p *memberPods) client(ctx context.Context) (*clientv3.Client, error) {
	var endpoints []string
	for _, m := range p.local.Members() {
		if m.Running() {
			endpoints = append(endpoints, m.ClientURL)
		}
	}
	return clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 2 * time.Second, Context: ctx, Logger: zap.NewNop()})
}

func (p *memberPods) memberList(ctx context.Context) (*clientv3.MemberListResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cli, err := p.client(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = cli.Close() }()
	return cli.MemberList(ctx)
}

// membership is etcd's member list as "name:voter" or "name:learner"
// (learners that never started are "?:learner"), sorted.
func (p *memberPods) membership(ctx context.Context) ([]string, error) {
	list, err := p.memberList(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range list.Members {
		name := m.Name
		if name == "" {
			name = "?"
		}
		role := "voter"
		if m.IsLearner {
			role = "learner"
		}
		out = append(out, name+":"+role)
	}
	slices.Sort(out)
	return out, nil
}

// watchMembership records every distinct membership etcd reports until the
// test ends.
func (p *memberPods) watchMembership(t *testing.T) func() [][]string {
	var (
		mu   sync.Mutex
		seen [][]string
	)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			if m, err := p.membership(ctx); err == nil {
				mu.Lock()
				if len(seen) == 0 || !slices.Equal(seen[len(seen)-1], m) {
					seen = append(seen, m)
				}
				mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return func() [][]string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(seen)
	}
}

func (p *memberPods) put(ctx context.Context, key, value string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cli, err := p.client(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = cli.Close() }()
	_, err = cli.Put(ctx, key, value)
	return err
}

func (p *memberPods) get(ctx context.Context, key string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cli, err := p.client(ctx)
	if err != nil {
		return "", err
	}
	defer func() { _ = cli.Close() }()
	resp, err := cli.Get(ctx, key)
	if err != nil {
		return "", err
	}
	if len(resp.Kvs) == 0 {
		return "", fmt.Errorf("%s not found", key)
	}
	return string(resp.Kvs[0].Value), nil
}

func answersHealth(ctx context.Context, url string) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/health", nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func podIsReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// voters returns a matcher on a cluster: phase Running, with n healthy
// voting members in etcd and no learner.
func runningWith(n int32) OmegaMatcher {
	return And(
		havePhase(etcdv1alpha1.EtcdClusterPhaseRunning),
		haveCondition(etcdv1alpha1.ConditionReady, metav1.ConditionTrue, etcdv1alpha1.ReasonMembersReady),
		WithTransform(func(c *etcdv1alpha1.EtcdCluster) int32 { return c.Status.HealthyMembers }, Equal(n)),
		WithTransform(func(c *etcdv1alpha1.EtcdCluster) int { return len(c.Status.Members) }, Equal(int(n))),
	)
}

// formCluster creates a cluster of size members played by memberPods and
// waits until it runs.
func formCluster(t *testing.T, name string, size int32, ephemeral bool, version string) (*etcdv1alpha1.EtcdCluster, *memberPods, func()) {
	t.Helper()
	g := NewWithT(t)
	ns := env().Namespace(t)
	pods := newMemberPods(t, ns, name, ephemeral)
	stop := pods.startManager(t)
	c := newCluster(ns, name, size)
	c.Spec.Storage.Ephemeral = ephemeral
	c.Spec.Version = version
	g.Expect(env().Client.Create(context.Background(), c)).To(Succeed())
	g.Eventually(getCluster(context.Background(), c), timeout, interval).Should(runningWith(size))
	return c, pods, stop
}

func setSize(ctx context.Context, g Gomega, c *etcdv1alpha1.EtcdCluster, size int32) {
	g.Eventually(func(g Gomega) {
		g.Expect(env().Client.Get(ctx, client.ObjectKeyFromObject(c), c)).To(Succeed())
		c.Spec.Size = size
		g.Expect(env().Client.Update(ctx, c)).To(Succeed())
	}, timeout, interval).Should(Succeed())
}

// learnersFirst asserts the recorded memberships: at most one learner at a
// time, every member that appeared came as a learner, and the voting
// members changed by one at a time.
func learnersFirst(g Gomega, seen [][]string) {
	voters := func(m []string) int {
		n := 0
		for _, e := range m {
			if strings.HasSuffix(e, ":voter") {
				n++
			}
		}
		return n
	}
	for i, m := range seen {
		learners := len(m) - voters(m)
		g.Expect(learners).To(BeNumerically("<=", 1), "more than one learner: %v", m)
		if i == 0 {
			continue
		}
		prev := seen[i-1]
		g.Expect(voters(m)-voters(prev)).To(BeNumerically("<=", 1), "%v then %v", prev, m)
		for _, e := range m {
			name := strings.TrimSuffix(e, ":voter")
			if name == e || name == "?" || slices.Contains(prev, e) {
				continue
			}
			// A learner that had not started yet has no name ("?:learner"):
			// with one learner at most, it is this member, started and
			// promoted between two samples.
			g.Expect(prev).To(Or(ContainElement(name+":learner"), ContainElement("?:learner")),
				"%s voted without being a learner first: %v then %v", name, prev, m)
		}
	}
}

// TestScaleUpAndDown: 3 → 5 adds each member as a learner first, promotes
// it once it caught up, one at a time; 5 → 3 with the leader on the highest
// member moves leadership away, and removes each member from etcd before
// its pod goes. A key written at 3 members is read at 5 and at 3 again.
func TestScaleUpAndDown(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ctx := context.Background()
	c, pods, _ := formCluster(t, "grow", 3, false, "")
	g.Eventually(func() error { return pods.put(ctx, "k1", "v1") }, timeout, interval).Should(Succeed())
	seen := pods.watchMembership(t)

	t.Log("STEP: 3 → 5")
	setSize(ctx, g, c, 5)
	g.Eventually(getCluster(ctx, c), timeout, interval).Should(havePhase(etcdv1alpha1.EtcdClusterPhaseScaling))
	g.Eventually(getCluster(ctx, c), 2*timeout, interval).Should(runningWith(5))
	g.Eventually(pods.membership).WithContext(ctx).Should(Equal([]string{
		"grow-0:voter", "grow-1:voter", "grow-2:voter", "grow-3:voter", "grow-4:voter"}))
	learnersFirst(g, seen())
	g.Expect(seen()).To(ContainElement(ContainElement("?:learner")), "a learner was added before its member started")
	g.Expect(pods.get(ctx, "k1")).To(Equal("v1"))
	g.Eventually(eventReasons(ctx, c), timeout, interval).Should(ContainElements(
		etcdv1alpha1.ReasonAddingLearner, etcdv1alpha1.ReasonStartingMember, etcdv1alpha1.ReasonPromotingLearner, "Scaling"))

	t.Log("STEP: the leader moved to grow-4, then 5 → 3")
	g.Eventually(func(g Gomega) {
		cli, err := pods.client(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		defer func() { _ = cli.Close() }()
		leaderURL := ""
		var target uint64
		list, err := cli.MemberList(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		for _, m := range list.Members {
			if m.Name == "grow-4" {
				target = m.ID
			}
		}
		for _, m := range pods.local.Members() {
			st, err := cli.Status(ctx, m.ClientURL)
			if err == nil && st.Leader == st.Header.MemberId {
				leaderURL = m.ClientURL
			}
		}
		g.Expect(leaderURL).NotTo(BeEmpty())
		if leaderURL != pods.local.Member("grow-4").ClientURL {
			lc, err := clientv3.New(clientv3.Config{Endpoints: []string{leaderURL}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
			g.Expect(err).NotTo(HaveOccurred())
			defer func() { _ = lc.Close() }()
			_, err = lc.MoveLeader(ctx, target)
			g.Expect(err).NotTo(HaveOccurred())
		}
		g.Expect(getCluster(ctx, c)(g).Status.Leader).To(Equal("grow-4"))
	}, timeout, 200*time.Millisecond).Should(Succeed())
	setSize(ctx, g, c, 3)
	g.Eventually(getCluster(ctx, c), 2*timeout, interval).Should(runningWith(3))
	g.Eventually(pods.membership).WithContext(ctx).Should(Equal([]string{"grow-0:voter", "grow-1:voter", "grow-2:voter"}))
	g.Eventually(eventReasons(ctx, c), timeout, interval).Should(ContainElements(
		etcdv1alpha1.ReasonMovingLeader, etcdv1alpha1.ReasonRemovingMember))
	g.Eventually(pods.podDeletions, timeout, interval).Should(HaveLen(2))
	deleted := pods.podDeletions()
	for _, d := range deleted {
		g.Expect(d.listed).To(BeFalse(), "%s's pod went while etcd listed it", d.pod)
	}
	g.Expect(pods.get(ctx, "k1")).To(Equal("v1"))
	sts := &appsv1.StatefulSet{}
	g.Expect(env().Client.Get(ctx, client.ObjectKey{Namespace: c.Namespace, Name: c.Name}, sts)).To(Succeed())
	g.Expect(*sts.Spec.Replicas).To(BeEquivalentTo(3))
}

// TestScaleDownKeepsQuorum: with two of five members down, removing a
// healthy one would leave 2 healthy of 4 voting members: the operator
// waits and says why; with the members back it scales down.
func TestScaleDownKeepsQuorum(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ctx := context.Background()
	c, pods, _ := formCluster(t, "shrink", 5, false, "")
	down := []*etcdtest.Member{pods.local.Member("shrink-0"), pods.local.Member("shrink-1")}
	for _, m := range down {
		pods.stopMember(m)
	}
	g.Eventually(getCluster(ctx, c), timeout, interval).Should(
		WithTransform(func(c *etcdv1alpha1.EtcdCluster) int32 { return c.Status.HealthyMembers }, BeEquivalentTo(3)))
	setSize(ctx, g, c, 3)
	g.Eventually(getCluster(ctx, c), timeout, interval).Should(
		haveCondition(etcdv1alpha1.ConditionProgressing, metav1.ConditionTrue, etcdv1alpha1.ReasonWaitingForQuorum))
	g.Eventually(pods.membership).WithContext(ctx).Should(HaveLen(5))
	g.Consistently(pods.membership, 2*time.Second, 100*time.Millisecond).WithContext(ctx).Should(HaveLen(5))
	g.Eventually(eventReasons(ctx, c), timeout, interval).Should(ContainElement(etcdv1alpha1.ReasonWaitingForQuorum))

	t.Log("STEP: the members back: the scale-down proceeds")
	for _, m := range down {
		g.Expect(pods.restartMember(m)).To(Succeed())
	}
	g.Eventually(getCluster(ctx, c), 2*timeout, interval).Should(runningWith(3))
	g.Eventually(pods.membership).WithContext(ctx).Should(HaveLen(3))
}

// TestScaleUpResumesOnAnotherManager: the operator stops after it added
// the learner and grew the StatefulSet, before the member's pod exists; a
// new manager takes the next steps from what etcd and the StatefulSet say.
func TestScaleUpResumesOnAnotherManager(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ctx := context.Background()
	c, pods, stop := formCluster(t, "resume", 3, false, "")
	pods.pause(true)
	setSize(ctx, g, c, 5)
	g.Eventually(pods.membership).WithContext(ctx).Should(ContainElement("?:learner"))
	sts := &appsv1.StatefulSet{}
	g.Eventually(func(g Gomega) int32 {
		g.Expect(env().Client.Get(ctx, client.ObjectKey{Namespace: c.Namespace, Name: c.Name}, sts)).To(Succeed())
		return *sts.Spec.Replicas
	}, timeout, interval).Should(BeEquivalentTo(4))
	stop()
	pods.pause(false)
	g.Consistently(pods.membership, time.Second, 100*time.Millisecond).WithContext(ctx).Should(ContainElement("?:learner"),
		"nobody promotes the learner while no operator runs")

	pods.startManager(t)
	g.Eventually(getCluster(ctx, c), 2*timeout, interval).Should(runningWith(5))
	g.Eventually(pods.membership).WithContext(ctx).Should(HaveLen(5))
}

// TestMemberRecovery: a member pod deleted on ephemeral storage comes back
// empty; the operator removes its old member and adds it again as a
// learner, the new pod joins and is promoted. A quorum of voting members
// serves throughout and a key written before is still there.
func TestMemberRecovery(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ctx := context.Background()
	c, pods, _ := formCluster(t, "recover", 3, true, "")
	g.Eventually(func() error { return pods.put(ctx, "k1", "v1") }, timeout, interval).Should(Succeed())
	before := getCluster(ctx, c)(g).Status.Members[1].ID
	seen := pods.watchMembership(t)

	pod := &corev1.Pod{}
	g.Expect(env().Client.Get(ctx, client.ObjectKey{Namespace: c.Namespace, Name: "recover-1"}, pod)).To(Succeed())
	g.Expect(env().Client.Delete(ctx, pod)).To(Succeed())
	g.Eventually(func(g Gomega) {
		got := getCluster(ctx, c)(g)
		g.Expect(got).To(runningWith(3))
		g.Expect(got.Status.Members[1].ID).NotTo(Equal(before), "recover-1 is a new member")
	}, 2*timeout, interval).Should(Succeed())
	g.Expect(pods.get(ctx, "k1")).To(Equal("v1"))
	g.Eventually(eventReasons(ctx, c), timeout, interval).Should(ContainElements(
		etcdv1alpha1.ReasonReplacingMember, etcdv1alpha1.ReasonAddingLearner, etcdv1alpha1.ReasonPromotingLearner))
	learnersFirst(g, seen())
	for _, m := range seen() {
		g.Expect(len(m)).To(BeNumerically(">=", 2), "membership %v", m)
	}
}

// TestUpgradeOneAtATime: a new version restarts the members one at a time,
// each only while every other member is ready, and the cluster runs on the
// new image in the end. With volumes (not ephemeral) each member restarts
// on its data: the same members, under the same IDs.
func TestUpgradeOneAtATime(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ctx := context.Background()
	c, pods, _ := formCluster(t, "upgrade", 3, false, "3.6.7")
	g.Eventually(func() error { return pods.put(ctx, "k1", "v1") }, timeout, interval).Should(Succeed())
	ids := func(c *etcdv1alpha1.EtcdCluster) []string {
		var out []string
		for _, m := range c.Status.Members {
			out = append(out, m.Name+"="+m.ID)
		}
		return out
	}
	before := ids(getCluster(ctx, c)(g))
	g.Eventually(func(g Gomega) {
		g.Expect(env().Client.Get(ctx, client.ObjectKeyFromObject(c), c)).To(Succeed())
		c.Spec.Version = "3.6.8"
		g.Expect(env().Client.Update(ctx, c)).To(Succeed())
	}, timeout, interval).Should(Succeed())
	g.Eventually(getCluster(ctx, c), timeout, interval).Should(havePhase(etcdv1alpha1.EtcdClusterPhaseUpgrading))
	g.Eventually(func(g Gomega) {
		list := &corev1.PodList{}
		g.Expect(env().Client.List(ctx, list, client.InNamespace(c.Namespace))).To(Succeed())
		g.Expect(list.Items).To(HaveLen(3))
		for _, p := range list.Items {
			g.Expect(p.Spec.Containers[0].Image).To(HaveSuffix(":v3.6.8"), p.Name)
		}
	}, 2*timeout, interval).Should(Succeed())
	g.Eventually(getCluster(ctx, c), timeout, interval).Should(runningWith(3))
	g.Expect(ids(getCluster(ctx, c)(g))).To(Equal(before), "on their volumes, the members restarted on their data")
	g.Eventually(pods.podDeletions, timeout, interval).Should(HaveLen(3), "each member restarted once")
	deleted := pods.podDeletions()
	for _, d := range deleted {
		g.Expect(d.othersReady).To(Equal(2), "%s restarted while another member was not ready", d.pod)
	}
	g.Expect(pods.get(ctx, "k1")).To(Equal("v1"))
	g.Eventually(eventReasons(ctx, c), timeout, interval).Should(ContainElements(etcdv1alpha1.ReasonRestartingMember, "Upgrading"))
}

// TestLeftoverLearnerRemoved: a scale-up undone before its learner started
// leaves a learner no member needs; it is removed first, then the
// StatefulSet shrinks back.
func TestLeftoverLearnerRemoved(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ctx := context.Background()
	c, pods, _ := formCluster(t, "undo", 3, false, "")
	pods.pause(true)
	setSize(ctx, g, c, 5)
	g.Eventually(pods.membership).WithContext(ctx).Should(ContainElement("?:learner"))
	setSize(ctx, g, c, 3)
	g.Eventually(pods.membership).WithContext(ctx).Should(Equal([]string{"undo-0:voter", "undo-1:voter", "undo-2:voter"}))
	g.Eventually(func(g Gomega) int32 {
		sts := &appsv1.StatefulSet{}
		g.Expect(env().Client.Get(ctx, client.ObjectKey{Namespace: c.Namespace, Name: c.Name}, sts)).To(Succeed())
		return *sts.Spec.Replicas
	}, timeout, interval).Should(BeEquivalentTo(3))
	g.Eventually(getCluster(ctx, c), timeout, interval).Should(runningWith(3))
	g.Eventually(eventReasons(ctx, c), timeout, interval).Should(ContainElement(etcdv1alpha1.ReasonRemovingMember))
}
