package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	etcdv1alpha1 "github.com/sharder-dev/sharder/examples/etcd-operator/api/v1alpha1"
)

// Membership is changed one step per reconcile, each step decided from what
// etcd, the StatefulSet and the pods say now, so a reconcile on another
// instance (after a move) or after a restart continues where the last one
// stopped. In order, the first that applies:
//
//  1. a new cluster: every gated pod is let start with the same initial
//     cluster (state new);
//  2. a learner no desired member needs (left over from an interrupted
//     scale-up) is removed;
//  3. a gated pod is prepared and let start: etcd is made to expect it
//     (added as a learner, or, when its data went with its old pod, removed
//     and added again) and its initial cluster is written on it;
//  4. a started learner is promoted (etcd refuses until it caught up);
//  5. size below the StatefulSet's replicas: the highest member is removed
//     from etcd (leadership moved away first, never below quorum); the
//     StatefulSet shrinks once etcd no longer lists it;
//  6. size above: the next member is added as a learner; the StatefulSet
//     grows once etcd lists it;
//  7. a member pod whose image or configuration is outdated is deleted,
//     one at a time, only while every voting member is healthy.

// memberState is what one reconcile knows about a cluster's membership.
type memberState struct {
	c *etcdv1alpha1.EtcdCluster
	s etcdv1alpha1.EtcdClusterSpec
	// stsExists: the cluster's StatefulSet exists; replicas is its
	// replica count (size when it does not exist).
	stsExists bool
	replicas  int32
	// pods by ordinal.
	pods map[int32]*corev1.Pod
	view etcdView
	// byOrdinal: etcd's members that are members of the StatefulSet, by
	// ordinal (matched by name or peer URL).
	byOrdinal map[int32]etcdMemberView
	// peerURL is the peer URL member i advertises.
	peerURL func(i int32) string
	// bootstrapped: the cluster has formed once (etcd answered, now or
	// before), so a pod starting without data must join, not found.
	bootstrapped bool
	// configHash is the ConfigMap's hash on the desired pod template.
	configHash string
	// endpoints are the client URLs etcd is asked at.
	endpoints []string
}

// newMemberState gathers the membership of c.
func (r *Reconciler) newMemberState(c *etcdv1alpha1.EtcdCluster, s etcdv1alpha1.EtcdClusterSpec, sts *appsv1.StatefulSet,
	pods []corev1.Pod, endpoints []string, view etcdView, configHash string) *memberState {
	ms := &memberState{
		c: c, s: s, view: view, configHash: configHash, endpoints: endpoints,
		replicas:     s.Size,
		pods:         map[int32]*corev1.Pod{},
		byOrdinal:    map[int32]etcdMemberView{},
		peerURL:      func(i int32) string { return r.opts.PeerURL(c, i) },
		bootstrapped: c.Status.ClusterID != "" || view.answered(),
	}
	if sts != nil {
		ms.stsExists = true
		ms.replicas = 1
		if sts.Spec.Replicas != nil {
			ms.replicas = *sts.Spec.Replicas
		}
	}
	for i := range pods {
		if ord, ok := podOrdinal(c, pods[i].Name); ok {
			ms.pods[ord] = &pods[i]
		}
	}
	limit := max(ms.replicas, s.Size, etcdv1alpha1.MaxSize) + 1
	for _, m := range view.members {
		for i := int32(0); i < limit; i++ {
			if m.name == memberName(c, i) || slices.Contains(m.peerURLs, ms.peerURL(i)) {
				ms.byOrdinal[i] = m
				break
			}
		}
	}
	return ms
}

// etcdClient is the client membership changes are made with.
type etcdClient = *clientv3.Client

// withEtcd runs fn with a client to the cluster's etcd at endpoints (nil:
// the healthy voting members, as a learner refuses membership changes),
// bounded by the etcd timeout, and closes it.
func (r *Reconciler) withEtcd(ctx context.Context, ms *memberState, access etcdAccess, endpoints []string,
	fn func(context.Context, etcdClient) error) error {
	if endpoints == nil {
		for _, m := range ms.view.members {
			if !m.learner && m.healthy && m.endpoint != "" {
				endpoints = append(endpoints, m.endpoint)
			}
		}
	}
	if endpoints == nil {
		endpoints = ms.endpoints
	}
	ctx, cancel := context.WithTimeout(ctx, r.opts.EtcdTimeout)
	defer cancel()
	cli, err := newEtcdClient(ctx, access, endpoints, r.opts.EtcdTimeout)
	if err != nil {
		return err
	}
	defer func() { _ = cli.Close() }()
	return fn(ctx, cli)
}

// podOrdinal is the ordinal of a member pod named <sts>-<ordinal>.
func podOrdinal(c *etcdv1alpha1.EtcdCluster, name string) (int32, bool) {
	rest, ok := strings.CutPrefix(name, statefulSetName(c)+"-")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(rest, 10, 32)
	if err != nil || n < 0 || strconv.FormatInt(n, 10) != rest {
		return 0, false
	}
	return int32(n), true
}

// ordinalOf is the ordinal of etcd member m, false if it is none of the
// StatefulSet's.
func (ms *memberState) ordinalOf(m etcdMemberView) (int32, bool) {
	for i, o := range ms.byOrdinal {
		if o.id == m.id {
			return i, true
		}
	}
	return 0, false
}

// nextReplicas is the StatefulSet's replica count for this reconcile: its
// current count, moved only as far as etcd agrees. A member is added to etcd
// before its pod exists and removed before its pod goes, so the count stays
// between size and the highest member etcd lists (a learner added for the
// next ordinal grows it by one; a member removed shrinks it by one), and a
// count changed by someone else is brought back into that range.
func (ms *memberState) nextReplicas() int32 {
	if !ms.stsExists {
		return ms.s.Size
	}
	if !ms.bootstrapped || !ms.view.answered() {
		return ms.replicas
	}
	top := int32(0)
	for i := range ms.byOrdinal {
		top = max(top, i+1)
	}
	return min(max(ms.replicas, min(ms.s.Size, top)), max(ms.s.Size, top))
}

// learners is the number of learners etcd lists.
func (ms *memberState) learners() int {
	n := 0
	for _, m := range ms.view.members {
		if m.learner {
			n++
		}
	}
	return n
}

// outdated reports whether a member pod runs another image or
// configuration than the desired ones.
func (ms *memberState) outdated(pod *corev1.Pod) bool {
	if pod.Annotations[annotationConfigHash] != ms.configHash {
		return true
	}
	for _, ctr := range pod.Spec.Containers {
		if ctr.Name == containerName {
			return ctr.Image != image(ms.s)
		}
	}
	return false
}

// upgrading reports whether a member pod runs another version than the spec's.
func (ms *memberState) upgrading() bool {
	for _, pod := range ms.pods {
		for _, ctr := range pod.Spec.Containers {
			if ctr.Name == containerName && ctr.Image != image(ms.s) {
				return true
			}
		}
	}
	return false
}

// scaling reports whether the membership is on its way to another size:
// replicas, voting members or learners differ from what the spec asks.
func (ms *memberState) scaling(replicas int32) bool {
	return replicas != ms.s.Size || ms.learners() > 0 || (ms.view.answered() && ms.view.voters() != ms.s.Size)
}

func gated(pod *corev1.Pod) bool {
	return slices.ContainsFunc(pod.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == membershipGate })
}

// memberStep is what one reconcile did, or waits for, to the membership.
type memberStep struct {
	// reason and message describe the step for the Progressing condition;
	// reason is ReasonMembersStable when nothing is to be done.
	reason, message string
	// acted: the step changed etcd or a pod; an event says so.
	acted bool
	// watched: the step waits for something the controller watches (a pod
	// being created or becoming ready), so it need not ask again soon.
	watched bool
}

func (st memberStep) progressing() bool { return st.reason != etcdv1alpha1.ReasonMembersStable }

// soon reports whether the next step should be looked for after the
// progress interval rather than the etcd check interval: etcd, which is not
// watched, is expected to change (a learner catching up, a member stopping).
func (st memberStep) soon() bool { return st.progressing() && !st.watched }

func waiting(reason, format string, args ...any) memberStep {
	return memberStep{reason: reason, message: fmt.Sprintf(format, args...)}
}

func waitingForPods(reason, format string, args ...any) memberStep {
	return memberStep{reason: reason, message: fmt.Sprintf(format, args...), watched: true}
}

func acted(reason, format string, args ...any) memberStep {
	return memberStep{reason: reason, message: fmt.Sprintf(format, args...), acted: true}
}

// stepMembers takes the next membership step (see the list above).
// replicas is the StatefulSet's replica count after this reconcile.
func (r *Reconciler) stepMembers(ctx context.Context, ms *memberState, access etcdAccess, replicas int32) (memberStep, error) {
	c, s, v := ms.c, ms.s, ms.view
	if !ms.bootstrapped {
		return r.startNewCluster(ctx, ms, replicas)
	}
	if !v.answered() || v.leaderID == 0 {
		return waiting(etcdv1alpha1.ReasonWaitingForQuorum, "etcd does not answer with a leader: membership is left as it is"), nil
	}

	// 2. Learners no desired member needs.
	for _, m := range v.members {
		if !m.learner {
			continue
		}
		if ord, ok := ms.ordinalOf(m); ok && ord < s.Size && ord <= replicas {
			continue
		}
		name := memberLabel(c, ms, m)
		if err := r.withEtcd(ctx, ms, access, nil, func(ctx context.Context, cli etcdClient) error {
			_, err := cli.MemberRemove(ctx, m.id)
			return err
		}); err != nil {
			return memberStep{}, fmt.Errorf("removing learner %s: %w", name, err)
		}
		return acted(etcdv1alpha1.ReasonRemovingMember, "removed learner %s, which no desired member needs", name), nil
	}

	// 3. Gated pods, lowest ordinal first.
	for i := int32(0); i < replicas; i++ {
		pod := ms.pods[i]
		if pod == nil || pod.DeletionTimestamp != nil || !gated(pod) {
			continue
		}
		return r.prepareMember(ctx, ms, access, i, pod)
	}

	// 4. Started learners.
	for i := int32(0); i < replicas; i++ {
		m, ok := ms.byOrdinal[i]
		if !ok || !m.learner {
			continue
		}
		pod := ms.pods[i]
		if pod == nil {
			return waitingForPods(etcdv1alpha1.ReasonStartingMember, "waiting for the pod of learner %s to be created", memberName(c, i)), nil
		}
		if gated(pod) {
			continue
		}
		err := r.withEtcd(ctx, ms, access, nil, func(ctx context.Context, cli etcdClient) error {
			_, err := cli.MemberPromote(ctx, m.id)
			return err
		})
		switch {
		case learnerNotReady(err):
			return waiting(etcdv1alpha1.ReasonPromotingLearner, "waiting for learner %s to catch up with the leader before promoting it", memberName(c, i)), nil
		case err != nil:
			return memberStep{}, fmt.Errorf("promoting learner %s: %w", memberName(c, i), err)
		}
		return acted(etcdv1alpha1.ReasonPromotingLearner, "promoted learner %s to a voting member", memberName(c, i)), nil
	}

	healthy, voters := v.healthyVoters(), v.voters()
	switch {
	case s.Size < replicas:
		return r.removeMember(ctx, ms, access, replicas-1)
	case s.Size < ms.replicas:
		return waiting(etcdv1alpha1.ReasonRemovingMember, "shrinking the StatefulSet to %d members", replicas), nil
	case s.Size > replicas:
		if healthy < voters || voters != replicas {
			return waiting(etcdv1alpha1.ReasonWaitingForHealthyMembers,
				"scaling to %d members waits for every voting member to be healthy: %d/%d healthy, %d listed", s.Size, healthy, replicas, voters), nil
		}
		name := memberName(c, replicas)
		if err := r.withEtcd(ctx, ms, access, nil, func(ctx context.Context, cli etcdClient) error {
			_, err := cli.MemberAddAsLearner(ctx, []string{ms.peerURL(replicas)})
			return err
		}); err != nil {
			return memberStep{}, fmt.Errorf("adding member %s as learner: %w", name, err)
		}
		return acted(etcdv1alpha1.ReasonAddingLearner, "added member %s as learner (scaling %d → %d)", name, replicas, s.Size), nil
	case s.Size > ms.replicas:
		return waiting(etcdv1alpha1.ReasonAddingLearner, "growing the StatefulSet to %d members", replicas), nil
	}
	return r.restartOutdated(ctx, ms, replicas)
}

// startNewCluster lets every gated pod of a cluster that never formed start
// with the same initial cluster: the members found it together.
func (r *Reconciler) startNewCluster(ctx context.Context, ms *memberState, replicas int32) (memberStep, error) {
	peers := make([]string, 0, replicas)
	for i := int32(0); i < replicas; i++ {
		peers = append(peers, memberName(ms.c, i)+"="+ms.peerURL(i))
	}
	started := 0
	for i := int32(0); i < replicas; i++ {
		pod := ms.pods[i]
		if pod == nil || pod.DeletionTimestamp != nil || !gated(pod) {
			continue
		}
		if err := r.ungate(ctx, pod, strings.Join(peers, ","), "new"); err != nil {
			return memberStep{}, err
		}
		started++
	}
	if started > 0 {
		return acted(etcdv1alpha1.ReasonBootstrapping, "started %d members of a new cluster of %d", started, replicas), nil
	}
	return waitingForPods(etcdv1alpha1.ReasonBootstrapping, "waiting for the %d members of a new cluster to form it", replicas), nil
}

// prepareMember makes etcd expect the member of gated pod i, then lets the
// pod start.
func (r *Reconciler) prepareMember(ctx context.Context, ms *memberState, access etcdAccess, i int32, pod *corev1.Pod) (memberStep, error) {
	c, s, v := ms.c, ms.s, ms.view
	name := memberName(c, i)
	m, listed := ms.byOrdinal[i]
	switch {
	case !listed:
		// Its member was removed (its data was lost): add it back.
		if v.healthyVoters() < quorum(v.voters()) {
			return waiting(etcdv1alpha1.ReasonWaitingForQuorum, "adding member %s waits for a quorum of healthy voting members", name), nil
		}
		if err := r.withEtcd(ctx, ms, access, nil, func(ctx context.Context, cli etcdClient) error {
			_, err := cli.MemberAddAsLearner(ctx, []string{ms.peerURL(i)})
			return err
		}); err != nil {
			return memberStep{}, fmt.Errorf("adding member %s as learner: %w", name, err)
		}
		return acted(etcdv1alpha1.ReasonAddingLearner, "added member %s as learner", name), nil
	case m.name != "" && s.Storage.Ephemeral:
		// It ran before, and its data went with its old pod: an empty member
		// must not start under the old ID. Remove it; it is added back as a
		// learner next.
		if m.healthy {
			return waiting(etcdv1alpha1.ReasonReplacingMember, "member %s still answers: waiting for its old process to stop", name), nil
		}
		healthyAfter, votersAfter := v.healthyVoters(), v.voters()
		if !m.learner {
			votersAfter--
		}
		if healthyAfter < quorum(votersAfter) {
			return waiting(etcdv1alpha1.ReasonWaitingForQuorum,
				"replacing member %s would leave %d healthy of %d voting members, below quorum", name, healthyAfter, votersAfter), nil
		}
		if err := r.withEtcd(ctx, ms, access, nil, func(ctx context.Context, cli etcdClient) error {
			_, err := cli.MemberRemove(ctx, m.id)
			return err
		}); err != nil {
			return memberStep{}, fmt.Errorf("removing member %s: %w", name, err)
		}
		return acted(etcdv1alpha1.ReasonReplacingMember, "removed member %s, whose data was lost with its pod, to add it back as a learner", name), nil
	}
	// Never started (a learner just added), or restarting on its own data.
	if err := r.ungate(ctx, pod, joinCluster(ms), "existing"); err != nil {
		return memberStep{}, err
	}
	if m.name == "" {
		return acted(etcdv1alpha1.ReasonStartingMember, "started member %s to join the cluster", name), nil
	}
	return acted(etcdv1alpha1.ReasonStartingMember, "started member %s on its data", name), nil
}

// joinCluster is the initial cluster of a member joining: exactly the
// members etcd lists, as etcd requires.
func joinCluster(ms *memberState) string {
	var peers []string
	for _, m := range ms.view.members {
		name := m.name
		if ord, ok := ms.ordinalOf(m); ok {
			name = memberName(ms.c, ord)
		} else if name == "" {
			name = formatID(m.id)
		}
		for _, u := range m.peerURLs {
			peers = append(peers, name+"="+u)
		}
	}
	return strings.Join(peers, ",")
}

// removeMember removes member i (the highest) from etcd before its pod
// goes: a learner at once, a voting member only if the healthy voting
// members left keep a quorum, and the leader only after it handed
// leadership to another member.
func (r *Reconciler) removeMember(ctx context.Context, ms *memberState, access etcdAccess, i int32) (memberStep, error) {
	c, v := ms.c, ms.view
	name := memberName(c, i)
	m, listed := ms.byOrdinal[i]
	if !listed {
		return waiting(etcdv1alpha1.ReasonRemovingMember, "shrinking the StatefulSet"), nil
	}
	if !m.learner {
		healthyAfter, votersAfter := v.healthyVoters(), v.voters()-1
		if m.healthy {
			healthyAfter--
		}
		if healthyAfter < quorum(votersAfter) {
			return waiting(etcdv1alpha1.ReasonWaitingForQuorum,
				"removing member %s would leave %d healthy of %d voting members, below quorum %d", name, healthyAfter, votersAfter, quorum(votersAfter)), nil
		}
		if m.id == v.leaderID {
			return r.moveLeader(ctx, ms, access, m, i)
		}
	}
	if err := r.withEtcd(ctx, ms, access, nil, func(ctx context.Context, cli etcdClient) error {
		_, err := cli.MemberRemove(ctx, m.id)
		return err
	}); err != nil {
		return memberStep{}, fmt.Errorf("removing member %s: %w", name, err)
	}
	return acted(etcdv1alpha1.ReasonRemovingMember, "removed member %s (scaling %d → %d)", name, ms.replicas, ms.s.Size), nil
}

// moveLeader hands leadership from leader (member i) to the healthy voting
// member of the lowest ordinal. The request goes to the leader itself.
func (r *Reconciler) moveLeader(ctx context.Context, ms *memberState, access etcdAccess, leader etcdMemberView, i int32) (memberStep, error) {
	for j := int32(0); j < i; j++ {
		to, ok := ms.byOrdinal[j]
		if !ok || to.learner || !to.healthy {
			continue
		}
		if err := r.withEtcd(ctx, ms, access, []string{leader.endpoint}, func(ctx context.Context, cli etcdClient) error {
			_, err := cli.MoveLeader(ctx, to.id)
			return err
		}); err != nil {
			return memberStep{}, fmt.Errorf("moving leadership from %s to %s: %w", memberName(ms.c, i), memberName(ms.c, j), err)
		}
		return acted(etcdv1alpha1.ReasonMovingLeader, "moved leadership from %s to %s before removing it", memberName(ms.c, i), memberName(ms.c, j)), nil
	}
	return waiting(etcdv1alpha1.ReasonWaitingForHealthyMembers, "no healthy member to take leadership from %s", memberName(ms.c, i)), nil
}

// restartOutdated deletes one member pod whose image or configuration is
// outdated, followers before the leader, while every member is healthy and
// ready; the StatefulSet recreates it from the current template.
func (r *Reconciler) restartOutdated(ctx context.Context, ms *memberState, replicas int32) (memberStep, error) {
	s, v := ms.s, ms.view
	var candidate *corev1.Pod
	var leaderPod *corev1.Pod
	allReady := true
	for i := int32(0); i < replicas; i++ {
		pod := ms.pods[i]
		if pod == nil || pod.DeletionTimestamp != nil || gated(pod) || !podReady(pod) {
			allReady = false
			continue
		}
		if !ms.outdated(pod) {
			continue
		}
		if m, ok := ms.byOrdinal[i]; ok && m.id == v.leaderID {
			leaderPod = pod
		} else if candidate == nil {
			candidate = pod
		}
	}
	if candidate == nil {
		candidate = leaderPod
	}
	if candidate == nil {
		return memberStep{reason: etcdv1alpha1.ReasonMembersStable, message: fmt.Sprintf("%d members, none to add, remove or restart", s.Size)}, nil
	}
	healthy, voters := v.healthyVoters(), v.voters()
	if !allReady || healthy < voters || voters != replicas {
		return waiting(etcdv1alpha1.ReasonWaitingForHealthyMembers,
			"restarting %s waits for every member to be healthy and ready: %d/%d voting members healthy", candidate.Name, healthy, voters), nil
	}
	if s.Storage.Ephemeral && replicas == 1 {
		return waiting(etcdv1alpha1.ReasonWaitingForHealthyMembers,
			"%s is the only member and its storage is ephemeral: restarting it would lose the data; restart it by hand", candidate.Name), nil
	}
	uid := candidate.UID
	if err := r.client.Delete(ctx, candidate, client.Preconditions{UID: &uid}); err != nil && !apierrors.IsNotFound(err) {
		return memberStep{}, fmt.Errorf("deleting pod %s to restart it: %w", candidate.Name, err)
	}
	log.FromContext(ctx).Info("Restarting member", "pod", candidate.Name, "version", s.Version)
	return acted(etcdv1alpha1.ReasonRestartingMember, "restarting %s on v%s", candidate.Name, s.Version), nil
}

// ungate writes the initial cluster on a member pod and removes its
// membership gate, so it is scheduled and starts.
func (r *Reconciler) ungate(ctx context.Context, pod *corev1.Pod, initialCluster, state string) error {
	updated := pod.DeepCopy()
	if updated.Annotations == nil {
		updated.Annotations = map[string]string{}
	}
	updated.Annotations[annotationInitialCluster] = initialCluster
	updated.Annotations[annotationInitialClusterState] = state
	updated.Spec.SchedulingGates = slices.DeleteFunc(updated.Spec.SchedulingGates,
		func(g corev1.PodSchedulingGate) bool { return g.Name == membershipGate })
	patch := client.MergeFromWithOptions(pod, client.MergeFromWithOptimisticLock{})
	if err := r.client.Patch(ctx, updated, patch); err != nil {
		return fmt.Errorf("letting pod %s start: %w", pod.Name, err)
	}
	return nil
}

// memberLabel names an etcd member for messages.
func memberLabel(c *etcdv1alpha1.EtcdCluster, ms *memberState, m etcdMemberView) string {
	if ord, ok := ms.ordinalOf(m); ok {
		return memberName(c, ord)
	}
	if m.name != "" {
		return m.name
	}
	return formatID(m.id)
}

// learnerNotReady reports etcd refusing to promote a learner that has not
// caught up with the leader yet.
func learnerNotReady(err error) bool {
	return err != nil && (errors.Is(err, rpctypes.ErrMemberLearnerNotReady) ||
		rpctypes.ErrorDesc(err) == rpctypes.ErrorDesc(rpctypes.ErrGRPCLearnerNotReady))
}
