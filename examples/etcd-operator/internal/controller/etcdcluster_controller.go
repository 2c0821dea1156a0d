package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	etcdv1alpha1 "github.com/sharder-dev/sharder/examples/etcd-operator/api/v1alpha1"
	"github.com/sharder-dev/sharder/internal/reconcilelog"
)

// Finalizer holds an EtcdCluster until its children are deleted.
const Finalizer = "etcd.example.sharder.dev/cleanup"

// ControllerName names the controller in logs and metrics.
const ControllerName = "etcdcluster"

// Options configures the reconciler. The zero value is valid.
type Options struct {
	// LabelChild is called on every child before it is created, with the
	// cluster that will own it. A sharded instance sets the owner's shard
	// label here so the child is in its own cache from the start.
	// Default: no change.
	LabelChild func(owner, child client.Object)

	// APIReader reads a child that exists but is missing from the cache,
	// to tell an object of someone else from one not yet labelled for this
	// instance. Default: the reconciler's client.
	APIReader client.Reader

	// RecoveryInterval is how soon a Failed cluster is reconciled again
	// when nothing it watches changes (a conflicting object outside the
	// cache going away is such a change). Default: 30s.
	RecoveryInterval time.Duration

	// DeletionRecheckInterval is how soon a deleting cluster checks again
	// that its children are gone, should the watch events not arrive.
	// Default: 5s.
	DeletionRecheckInterval time.Duration

	// MaxConcurrentReconciles is the number of clusters reconciled at once.
	// Default: 4.
	MaxConcurrentReconciles int

	// Wrap wraps the reconciler before the controller calls it, e.g. with
	// a sharded instance's drain acknowledgement or a reconcile log. An
	// error fails SetupWithManager.
	// Default: none.
	Wrap func(next reconcile.Reconciler) (reconcile.Reconciler, error)

	// Clock stamps status times. Default: the real clock.
	Clock clock.PassiveClock

	// Endpoints returns the client URLs the operator asks etcd at, given
	// the cluster and its member pods. Default: each pod's IP with the
	// client port (memberEndpoints).
	Endpoints func(c *etcdv1alpha1.EtcdCluster, pods []corev1.Pod) []string

	// EtcdTimeout bounds the operator's calls to one cluster's etcd in a
	// reconcile (member list and each member's status). Default: 5s.
	EtcdTimeout time.Duration

	// EtcdCheckInterval is how soon a cluster that is not Failed is
	// reconciled again to ask etcd, which the operator does not watch.
	// Default: 15s.
	EtcdCheckInterval time.Duration

	// ProgressInterval is how soon a cluster whose membership is changing
	// (a learner catching up, a member being added, removed or restarted)
	// is reconciled again to take the next step. Default: 2s.
	ProgressInterval time.Duration

	// PeerURL returns the peer URL member ordinal of the cluster
	// advertises: the URL it is added to etcd with and recognised by.
	// Default: its stable DNS name through the peer Service (peerURL).
	PeerURL func(c *etcdv1alpha1.EtcdCluster, ordinal int32) string
}

func (o Options) withDefaults(c client.Client) Options {
	if o.LabelChild == nil {
		o.LabelChild = func(_, _ client.Object) {}
	}
	if o.APIReader == nil {
		o.APIReader = c
	}
	if o.RecoveryInterval <= 0 {
		o.RecoveryInterval = 30 * time.Second
	}
	if o.DeletionRecheckInterval <= 0 {
		o.DeletionRecheckInterval = 5 * time.Second
	}
	if o.MaxConcurrentReconciles <= 0 {
		o.MaxConcurrentReconciles = 4
	}
	if o.Wrap == nil {
		o.Wrap = func(r reconcile.Reconciler) (reconcile.Reconciler, error) { return r, nil }
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.Endpoints == nil {
		o.Endpoints = memberEndpoints
	}
	if o.EtcdTimeout <= 0 {
		o.EtcdTimeout = 5 * time.Second
	}
	if o.EtcdCheckInterval <= 0 {
		o.EtcdCheckInterval = 15 * time.Second
	}
	if o.ProgressInterval <= 0 {
		o.ProgressInterval = 2 * time.Second
	}
	if o.PeerURL == nil {
		o.PeerURL = func(c *etcdv1alpha1.EtcdCluster, i int32) string { return peerURL(c, spec(c), i) }
	}
	return o
}

// Reconciler reconciles EtcdClusters. Create it with NewReconciler.
type Reconciler struct {
	client   client.Client
	scheme   *runtime.Scheme
	recorder events.EventRecorder
	opts     Options
}

// NewReconciler returns a reconciler reading and writing through c (a
// manager's client reads from its cache), resolving kinds with scheme and
// reporting events to recorder (nil: none).
func NewReconciler(c client.Client, scheme *runtime.Scheme, recorder events.EventRecorder, opts Options) *Reconciler {
	return &Reconciler{client: c, scheme: scheme, recorder: recorder, opts: opts.withDefaults(c)}
}

// SetupWithManager registers the controller: it reconciles a cluster when
// the cluster, one of its children or one of its member pods changes. The
// manager's cache must serve EtcdClusters, ConfigMaps, Services,
// StatefulSets, PodDisruptionBudgets, Pods and Secrets.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	wrapped, err := r.opts.Wrap(r)
	if err != nil {
		return fmt.Errorf("wrapping the %s reconciler: %w", ControllerName, err)
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		For(&etcdv1alpha1.EtcdCluster{}).
		Owns(&corev1.ConfigMap{}).
		Owns(&corev1.Service{}).
		Owns(&appsv1.StatefulSet{}).
		Owns(&policyv1.PodDisruptionBudget{}).
		Owns(&corev1.Secret{}).
		// Pods are owned by the StatefulSet, not the cluster: map them back
		// by label. Only creation, deletion, readiness, the address (where
		// etcd is asked) and the membership gate matter.
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(podToCluster),
			builder.WithPredicates(predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
				return podReady(e.ObjectOld) != podReady(e.ObjectNew) || podIP(e.ObjectOld) != podIP(e.ObjectNew) ||
					podGated(e.ObjectOld) != podGated(e.ObjectNew)
			}})).
		WithOptions(controller.Options{MaxConcurrentReconciles: r.opts.MaxConcurrentReconciles}).
		Complete(wrapped)
}

func podToCluster(_ context.Context, obj client.Object) []reconcile.Request {
	name := obj.GetLabels()[LabelCluster]
	if name == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: obj.GetNamespace(), Name: name}}}
}

func podIP(obj client.Object) string {
	if pod, ok := obj.(*corev1.Pod); ok {
		return pod.Status.PodIP
	}
	return ""
}

func podGated(obj client.Object) bool {
	pod, ok := obj.(*corev1.Pod)
	return ok && gated(pod)
}

func podReady(obj client.Object) bool {
	pod, ok := obj.(*corev1.Pod)
	if !ok || pod.DeletionTimestamp != nil {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// +kubebuilder:rbac:groups=etcd.example.sharder.dev,resources=etcdclusters,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=etcd.example.sharder.dev,resources=etcdclusters/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=etcd.example.sharder.dev,resources=etcdclusters/finalizers,verbs=update
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=configmaps;services,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=apps,resources=statefulsets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=policy,resources=poddisruptionbudgets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;patch;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile brings one EtcdCluster's children to its spec and reports what
// it observed in its status. It reads only from the cache and writes with
// optimistic locks, so a stale view fails and is retried rather than
// undoing a newer change.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, retErr error) {
	cluster := &etcdv1alpha1.EtcdCluster{}
	if err := r.client.Get(ctx, req.NamespacedName, cluster); err != nil {
		// Gone, or no longer assigned to this instance: nothing to do.
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	reconcilelog.SetGeneration(ctx, cluster.Generation)
	// The cache's object is shared: work on a copy (Get already copies) and
	// remember the status as read for the deferred patch.
	original := cluster.DeepCopy()
	defer func() {
		if err := r.patchStatus(ctx, original, cluster); err != nil {
			retErr = errors.Join(retErr, err)
		}
	}()

	if !cluster.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, cluster)
	}

	// The finalizer is stored before any child exists, so no child can
	// outlive a deletion the operator did not see.
	if controllerutil.AddFinalizer(cluster, Finalizer) {
		patch := client.MergeFromWithOptions(original, client.MergeFromWithOptimisticLock{})
		if err := r.client.Patch(ctx, cluster, patch); err != nil {
			return ctrl.Result{}, fmt.Errorf("adding finalizer: %w", err)
		}
		original = cluster.DeepCopy()
	}
	return r.reconcileNormal(ctx, cluster)
}

func (r *Reconciler) reconcileNormal(ctx context.Context, c *etcdv1alpha1.EtcdCluster) (ctrl.Result, error) {
	logger := log.FromContext(ctx)
	s := spec(c)

	failure := ""
	var failureErr error
	// Certificates and the root password come first: the members mount
	// them, and the operator's client uses them.
	renewIn, err := r.ensureSecurity(ctx, c)
	var se *childError
	if errors.As(err, &se) {
		failure, failureErr = se.Reason, se
	} else if err != nil {
		return ctrl.Result{}, err
	}

	// What etcd, the StatefulSet and the pods say now decides the
	// StatefulSet's replicas and the next membership step.
	sts, err := r.statefulSet(ctx, c)
	if err != nil {
		return ctrl.Result{}, err
	}
	pods, err := r.pods(ctx, c)
	if err != nil {
		return ctrl.Result{}, err
	}
	endpoints := r.opts.Endpoints(c, pods)
	var view etcdView
	access, err := clusterAccess(ctx, r.secretReader(), c)
	if err != nil {
		view = etcdView{err: err}
	} else {
		view = observeEtcd(ctx, access, endpoints, r.opts.EtcdTimeout)
	}
	if view.err != nil && ctx.Err() != nil {
		// Cancelled (the instance stops or hands the cluster over): say
		// nothing about etcd rather than that it did not answer.
		return ctrl.Result{}, ctx.Err()
	}
	configHash := hashData(configData(c, s))
	ms := r.newMemberState(c, s, sts, pods, endpoints, view, configHash)
	replicas := ms.nextReplicas()

	for _, ch := range r.children(c, replicas) {
		if failure != "" {
			break
		}
		err := r.ensure(ctx, c, ch)
		var ce *childError
		if errors.As(err, &ce) {
			failure, failureErr = ce.Reason, ce
			break
		}
		if err != nil {
			// Transient (conflict, timeout, not yet labelled): retry with
			// backoff; the status keeps what it said.
			return ctrl.Result{}, err
		}
	}

	var step memberStep
	if failure == "" && sts != nil {
		step, err = r.stepMembers(ctx, ms, access, replicas)
		if err != nil {
			r.event(c, corev1.EventTypeWarning, "MembershipFailed", "Reconcile", "Membership step failed: %v", err)
			return ctrl.Result{}, err
		}
	}

	ready := int32(0)
	if sts != nil {
		ready = sts.Status.ReadyReplicas
	}
	r.ensureAuth(ctx, c, access, endpoints, view)
	members := desiredMembers(c, s, pods, view, ms.peerURL)
	healthy := view.healthyVoters()
	serving := view.answered() && view.leaderID != 0 && healthy >= quorum(s.Size)

	prevPhase := c.Status.Phase
	phase, reason := nextPhase(observation{
		phase:     prevPhase,
		reason:    readyReason(c),
		failure:   failure,
		size:      s.Size,
		ready:     ready,
		serving:   serving,
		complete:  serving && view.voters() == s.Size && healthy >= s.Size,
		scaling:   ms.scaling(replicas),
		upgrading: ms.upgrading(),
	})
	r.setStatus(c, s, phase, reason, failureErr, ready, members, view)
	r.setProgress(c, step)

	if phase != prevPhase {
		logger.Info("Phase changed", "from", prevPhase, "to", phase, "reason", reason)
		switch {
		case phase == etcdv1alpha1.EtcdClusterPhaseFailed:
			msg := "members lost their quorum"
			if failureErr != nil {
				msg = failureErr.Error()
			}
			r.event(c, corev1.EventTypeWarning, reason, "Reconcile", "Cluster failed: %s", msg)
		case prevPhase == etcdv1alpha1.EtcdClusterPhaseFailed:
			r.event(c, corev1.EventTypeNormal, "Recovered", "Reconcile", "Cluster recovered: now %s", phase)
		default:
			r.event(c, corev1.EventTypeNormal, string(phase), "Reconcile", "Cluster is %s: %d/%d members ready", phase, ready, s.Size)
		}
	}
	if phase == etcdv1alpha1.EtcdClusterPhaseFailed {
		return ctrl.Result{RequeueAfter: r.opts.RecoveryInterval}, nil
	}
	if step.soon() {
		return ctrl.Result{RequeueAfter: r.opts.ProgressInterval}, nil
	}
	// etcd is not watched: ask it again (leader, health) after a while,
	// sooner if a certificate is due for renewal.
	next := r.opts.EtcdCheckInterval
	if renewIn > 0 {
		next = min(next, renewIn)
	}
	return ctrl.Result{RequeueAfter: next}, nil
}

// setProgress writes the membership step into the Progressing condition,
// and records an event for a step that changed something.
func (r *Reconciler) setProgress(c *etcdv1alpha1.EtcdCluster, step memberStep) {
	if step.reason == "" {
		return
	}
	status := metav1.ConditionTrue
	if !step.progressing() {
		status = metav1.ConditionFalse
	}
	// The condition is changed in place: remember what it said.
	prevMessage := ""
	if prev := meta.FindStatusCondition(c.Status.Conditions, etcdv1alpha1.ConditionProgressing); prev != nil {
		prevMessage = prev.Message
	}
	r.setCondition(c, etcdv1alpha1.ConditionProgressing, status, step.reason, step.message)
	switch {
	case step.acted:
		r.event(c, corev1.EventTypeNormal, step.reason, "Membership", "%s", step.message)
	case step.progressing() && prevMessage != step.message:
		// Waiting: said once per new reason to wait, not every retry.
		r.event(c, corev1.EventTypeNormal, step.reason, "Membership", "%s", step.message)
	}
}

func (r *Reconciler) reconcileDelete(ctx context.Context, c *etcdv1alpha1.EtcdCluster) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(c, Finalizer) {
		return ctrl.Result{}, nil
	}
	if c.Status.Phase != etcdv1alpha1.EtcdClusterPhaseDeleting {
		c.Status.Phase = etcdv1alpha1.EtcdClusterPhaseDeleting
		c.Status.LastUpdateTime = ptrTime(r.opts.Clock.Now())
		r.event(c, corev1.EventTypeNormal, "Deleting", "Delete", "Deleting the cluster's objects")
	}
	r.setCondition(c, etcdv1alpha1.ConditionReady, metav1.ConditionFalse, etcdv1alpha1.ReasonDeleting, "the cluster is being deleted")

	remaining, err := r.deleteChildren(ctx, c)
	if err != nil {
		return ctrl.Result{}, err
	}
	if remaining > 0 {
		return ctrl.Result{RequeueAfter: r.opts.DeletionRecheckInterval}, nil
	}
	// Every child is gone: let the cluster go. The patch response replaces
	// c, so the deferred status patch finds nothing left to write.
	before := c.DeepCopy()
	controllerutil.RemoveFinalizer(c, Finalizer)
	patch := client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})
	if err := r.client.Patch(ctx, c, patch); err != nil {
		return ctrl.Result{}, fmt.Errorf("removing finalizer: %w", client.IgnoreNotFound(err))
	}
	log.FromContext(ctx).Info("Cluster deleted")
	return ctrl.Result{}, nil
}

// statefulSet is the cluster's StatefulSet; nil while it does not exist
// (or not in this instance's cache), or belongs to someone else.
func (r *Reconciler) statefulSet(ctx context.Context, c *etcdv1alpha1.EtcdCluster) (*appsv1.StatefulSet, error) {
	sts := &appsv1.StatefulSet{}
	err := r.client.Get(ctx, types.NamespacedName{Namespace: c.Namespace, Name: statefulSetName(c)}, sts)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading StatefulSet: %w", err)
	}
	if ref := metav1.GetControllerOf(sts); ref == nil || ref.UID != c.UID {
		return nil, nil
	}
	return sts, nil
}

// pods lists the cluster's member pods.
func (r *Reconciler) pods(ctx context.Context, c *etcdv1alpha1.EtcdCluster) ([]corev1.Pod, error) {
	pods := &corev1.PodList{}
	if err := r.client.List(ctx, pods, client.InNamespace(c.Namespace), client.MatchingLabels(selectorLabels(c))); err != nil {
		return nil, fmt.Errorf("listing member pods: %w", err)
	}
	return pods.Items, nil
}

// desiredMembers lists the desired members, by ordinal, with the readiness
// their pods report and what etcd says of them (matched by name, or by the
// peer URL peer gives the ordinal for a member that never started),
// followed by any member etcd lists that the spec does not ask for.
func desiredMembers(c *etcdv1alpha1.EtcdCluster, s etcdv1alpha1.EtcdClusterSpec, pods []corev1.Pod, view etcdView,
	peer func(int32) string) []etcdv1alpha1.EtcdMember {
	ready := map[string]bool{}
	for i := range pods {
		ready[pods[i].Name] = podReady(&pods[i])
	}
	byName := map[string]etcdMemberView{}
	for _, m := range view.members {
		byName[m.name] = m
	}
	members := make([]etcdv1alpha1.EtcdMember, 0, s.Size)
	desired := map[string]bool{}
	matched := map[uint64]bool{}
	for i := int32(0); i < s.Size; i++ {
		name := memberName(c, i)
		desired[name] = true
		m := etcdv1alpha1.EtcdMember{
			Name:      name,
			PeerURL:   peerURL(c, s, i),
			ClientURL: clientURL(c, s, i),
			Ready:     ready[name],
		}
		e, ok := byName[name]
		if !ok {
			for _, u := range view.members {
				if u.name == "" && slices.Contains(u.peerURLs, peer(i)) {
					e, ok = u, true
				}
			}
		}
		if ok {
			m.ID, m.IsLearner, m.Healthy, m.Version = formatID(e.id), e.learner, e.healthy, e.version
			matched[e.id] = true
		}
		members = append(members, m)
	}
	for _, e := range view.members {
		if desired[e.name] || matched[e.id] {
			continue
		}
		// A member added but never started has no name yet: its ID names it.
		name := e.name
		if name == "" {
			name = formatID(e.id)
		}
		m := etcdv1alpha1.EtcdMember{Name: name, ID: formatID(e.id), IsLearner: e.learner, Healthy: e.healthy, Ready: ready[name], Version: e.version}
		if len(e.peerURLs) > 0 {
			m.PeerURL = e.peerURLs[0]
		}
		if len(e.clientURLs) > 0 {
			m.ClientURL = e.clientURLs[0]
		}
		members = append(members, m)
	}
	return members
}

// setStatus writes what this reconcile observed into c.Status.
func (r *Reconciler) setStatus(c *etcdv1alpha1.EtcdCluster, s etcdv1alpha1.EtcdClusterSpec, phase etcdv1alpha1.EtcdClusterPhase,
	reason string, failureErr error, ready int32, members []etcdv1alpha1.EtcdMember, view etcdView) {
	st := &c.Status
	if st.Phase != phase {
		st.Phase = phase
		st.LastUpdateTime = ptrTime(r.opts.Clock.Now())
	}
	st.ObservedGeneration = c.Generation
	st.ReadyReplicas = ready
	st.Members = members
	st.ClientEndpoints = []string{clientEndpoint(c, s)}
	healthy := view.healthyVoters()
	st.HealthyMembers = healthy
	// An unanswered etcd tells nothing of its ID: keep the last one known
	// (it does not change for the life of a cluster).
	if view.answered() {
		st.ClusterID = formatID(view.clusterID)
	}
	st.LeaderID = formatID(view.leaderID)
	st.Leader = ""
	if m, ok := view.member(view.leaderID); ok {
		st.Leader = m.name
	}

	var ce *childError
	if errors.As(failureErr, &ce) {
		r.setCondition(c, etcdv1alpha1.ConditionResourcesReady, metav1.ConditionFalse, ce.Reason, ce.Error())
	} else {
		r.setCondition(c, etcdv1alpha1.ConditionResourcesReady, metav1.ConditionTrue, etcdv1alpha1.ReasonReconciled,
			"ConfigMap, Services, StatefulSet and PodDisruptionBudget match the spec")
	}

	q := quorum(s.Size)
	var counts string
	if view.answered() {
		counts = fmt.Sprintf("etcd: %d/%d voting members healthy", healthy, s.Size)
		if v := view.voters(); v != s.Size {
			counts += fmt.Sprintf(", %d voting members listed", v)
		}
		if n := len(view.members) - int(view.voters()); n > 0 {
			counts += fmt.Sprintf(", %d learners", n)
		}
		if st.Leader != "" {
			counts += ", leader " + st.Leader
		} else {
			counts += ", no leader"
		}
	} else {
		counts = "etcd does not answer: " + view.err.Error()
	}
	counts += fmt.Sprintf("; %d/%d pods ready; quorum %d", ready, s.Size, q)
	serving := view.answered() && view.leaderID != 0 && healthy >= q
	switch {
	case serving && ready >= q:
		r.setCondition(c, etcdv1alpha1.ConditionAvailable, metav1.ConditionTrue, etcdv1alpha1.ReasonQuorumReady, counts)
	case !serving && (!view.answered() || view.leaderID == 0):
		r.setCondition(c, etcdv1alpha1.ConditionAvailable, metav1.ConditionFalse, etcdv1alpha1.ReasonEtcdUnreachable, counts)
	default:
		r.setCondition(c, etcdv1alpha1.ConditionAvailable, metav1.ConditionFalse, etcdv1alpha1.ReasonMembersNotReady, counts)
	}
	complete := serving && view.voters() == s.Size && healthy >= s.Size

	switch {
	case phase == etcdv1alpha1.EtcdClusterPhaseFailed:
		msg := counts
		if failureErr != nil {
			msg = failureErr.Error()
		}
		r.setCondition(c, etcdv1alpha1.ConditionReady, metav1.ConditionFalse, reason, msg)
	case complete && ready >= s.Size:
		r.setCondition(c, etcdv1alpha1.ConditionReady, metav1.ConditionTrue, etcdv1alpha1.ReasonMembersReady, counts)
	case !view.answered() || view.leaderID == 0:
		r.setCondition(c, etcdv1alpha1.ConditionReady, metav1.ConditionFalse, etcdv1alpha1.ReasonEtcdUnreachable, counts)
	case view.voters() != s.Size:
		r.setCondition(c, etcdv1alpha1.ConditionReady, metav1.ConditionFalse, etcdv1alpha1.ReasonMembersMismatch, counts)
	default:
		r.setCondition(c, etcdv1alpha1.ConditionReady, metav1.ConditionFalse, etcdv1alpha1.ReasonMembersNotReady, counts)
	}
}

func (r *Reconciler) setCondition(c *etcdv1alpha1.EtcdCluster, typ string, status metav1.ConditionStatus, reason, msg string) {
	setStatusCondition(&c.Status.Conditions, c.Generation, r.opts.Clock.Now(), typ, status, reason, msg)
}

// readyReason is the reason of c's Ready condition, "" if it has none.
func readyReason(c *etcdv1alpha1.EtcdCluster) string {
	if cond := meta.FindStatusCondition(c.Status.Conditions, etcdv1alpha1.ConditionReady); cond != nil {
		return cond.Reason
	}
	return ""
}

// patchStatus writes c's status if it differs from original's.
func (r *Reconciler) patchStatus(ctx context.Context, original, c *etcdv1alpha1.EtcdCluster) error {
	return writeStatus(ctx, r.client, original, c, equality.Semantic.DeepEqual(original.Status, c.Status))
}

// event records an event about c, if there is a recorder.
func (r *Reconciler) event(c *etcdv1alpha1.EtcdCluster, eventType, reason, action, note string, args ...any) {
	recordEvent(r.recorder, c, eventType, reason, action, note, args...)
}

func ptrTime(t time.Time) *metav1.Time {
	mt := metav1.NewTime(t)
	return &mt
}
