package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	etcdv1alpha1 "github.com/sharder-dev/sharder/examples/etcd-operator/api/v1alpha1"
)

// RestoreControllerName names the EtcdRestore controller in logs and metrics.
const RestoreControllerName = "etcdrestore"

// Reasons of an EtcdRestore's Succeeded condition besides the bad-input ones.
const (
	ReasonRestoreTypeNotSupported = "RestoreTypeNotSupported"
	ReasonNoRestoreImage          = "NoRestoreImage"
	ReasonBackupNotFound          = "BackupNotFound"
	ReasonBackupNotCompleted      = "BackupNotCompleted"
	ReasonSnapshotNotFound        = "SnapshotNotFound"
	ReasonClusterExists           = "ClusterExists"
	ReasonClusterDeleted          = "ClusterDeleted"
	ReasonClusterStarting         = "ClusterStarting"
	ReasonRestored                = "Restored"
)

// RestoreOptions configures the EtcdRestore reconciler. The zero value is
// valid but for Image.
type RestoreOptions struct {
	// Image is the operator's image: the restored members' init container
	// runs its restore-member subcommand. Empty: restores fail with the
	// reason NoRestoreImage.
	Image string

	// APIReader reads what is outside the instance's cache: the EtcdBackup,
	// the restored EtcdCluster (each assigned on its own) and the
	// credentials Secret. Default: the client.
	APIReader client.Reader

	// Wrap wraps the reconciler, e.g. with the instance's drain
	// acknowledgement. Default: none.
	Wrap func(next reconcile.Reconciler) (reconcile.Reconciler, error)

	// Clock stamps status times. Default: the real clock.
	Clock clock.PassiveClock

	// PollInterval is how often a restore looks at its cluster while it
	// starts (the cluster is not watched: it is assigned on its own).
	// Default: 5s.
	PollInterval time.Duration

	// RetryInterval is how soon a restore that cannot start (backup or
	// snapshot missing, name taken) is tried again. Default: 30s.
	RetryInterval time.Duration
}

func (o RestoreOptions) withDefaults(c client.Client) RestoreOptions {
	if o.APIReader == nil {
		o.APIReader = c
	}
	if o.Wrap == nil {
		o.Wrap = func(r reconcile.Reconciler) (reconcile.Reconciler, error) { return r, nil }
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.PollInterval <= 0 {
		o.PollInterval = 5 * time.Second
	}
	if o.RetryInterval <= 0 {
		o.RetryInterval = 30 * time.Second
	}
	return o
}

// RestoreReconciler creates the clusters EtcdRestores ask for. Create it
// with NewRestoreReconciler.
type RestoreReconciler struct {
	client   client.Client
	scheme   *runtime.Scheme
	recorder events.EventRecorder
	opts     RestoreOptions
}

// NewRestoreReconciler returns a reconciler reading restores through c and
// reporting events to recorder (nil: none).
func NewRestoreReconciler(c client.Client, scheme *runtime.Scheme, recorder events.EventRecorder, opts RestoreOptions) *RestoreReconciler {
	return &RestoreReconciler{client: c, scheme: scheme, recorder: recorder, opts: opts.withDefaults(c)}
}

// SetupWithManager registers the controller. The manager's cache must serve
// EtcdRestores.
func (r *RestoreReconciler) SetupWithManager(mgr ctrl.Manager) error {
	wrapped, err := r.opts.Wrap(r)
	if err != nil {
		return fmt.Errorf("wrapping the %s reconciler: %w", RestoreControllerName, err)
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named(RestoreControllerName).
		For(&etcdv1alpha1.EtcdRestore{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		WithOptions(controller.Options{MaxConcurrentReconciles: 2}).
		Complete(wrapped)
}

// +kubebuilder:rbac:groups=etcd.example.sharder.dev,resources=etcdrestores,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=etcd.example.sharder.dev,resources=etcdrestores/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=etcd.example.sharder.dev,resources=etcdclusters,verbs=create
// +kubebuilder:rbac:groups=etcd.example.sharder.dev,resources=etcdbackups,verbs=get;list;watch

// Reconcile checks that the backup's snapshot exists, creates the new
// cluster (never touching one it did not create), and follows it until it
// is Running.
func (r *RestoreReconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, retErr error) {
	rs := &etcdv1alpha1.EtcdRestore{}
	if err := r.client.Get(ctx, req.NamespacedName, rs); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !rs.DeletionTimestamp.IsZero() || rs.Status.Phase == etcdv1alpha1.EtcdRestorePhaseCompleted {
		return ctrl.Result{}, nil
	}
	original := rs.DeepCopy()
	defer func() {
		if err := r.patchStatus(ctx, original, rs); err != nil {
			retErr = errors.Join(retErr, err)
		}
	}()

	if rs.Spec.RestoreType == etcdv1alpha1.RestoreTypeReplace {
		r.fail(rs, ReasonRestoreTypeNotSupported, "restoreType Replace is not supported: restore into a New cluster")
		return ctrl.Result{}, nil
	}
	if r.opts.Image == "" {
		r.fail(rs, ReasonNoRestoreImage, "the operator was started without --restore-image")
		return ctrl.Result{}, nil
	}

	cluster := &etcdv1alpha1.EtcdCluster{}
	err := r.opts.APIReader.Get(ctx, client.ObjectKey{Namespace: rs.Namespace, Name: rs.Spec.ClusterName}, cluster)
	switch {
	case err == nil:
		if src, ok := restoreSourceOf(cluster); !ok || src.RestoreUID != rs.UID {
			r.fail(rs, ReasonClusterExists, fmt.Sprintf("EtcdCluster %s exists and was not made by this restore: refusing to overwrite it", rs.Spec.ClusterName))
			return ctrl.Result{RequeueAfter: r.opts.RetryInterval}, nil
		}
		return r.follow(ctx, rs, cluster)
	case !apierrors.IsNotFound(err):
		return ctrl.Result{}, fmt.Errorf("reading EtcdCluster %s: %w", rs.Spec.ClusterName, err)
	case rs.Status.RestoredCluster != "":
		r.fail(rs, ReasonClusterDeleted, fmt.Sprintf("the restored EtcdCluster %s was deleted", rs.Status.RestoredCluster))
		return ctrl.Result{}, nil
	}

	src, size, err := r.findSnapshot(ctx, rs)
	if err != nil {
		var ie *inputError
		if !errors.As(err, &ie) {
			return ctrl.Result{}, err
		}
		r.fail(rs, ie.Reason, ie.Error())
		return ctrl.Result{RequeueAfter: r.opts.RetryInterval}, nil
	}
	raw, err := json.Marshal(src)
	if err != nil {
		return ctrl.Result{}, err
	}
	cluster = &etcdv1alpha1.EtcdCluster{ObjectMeta: metav1.ObjectMeta{
		Namespace:   rs.Namespace,
		Name:        rs.Spec.ClusterName,
		Annotations: map[string]string{AnnotationRestoreSource: string(raw)},
	}}
	if rs.Spec.ClusterTemplate != nil {
		cluster.Spec = *rs.Spec.ClusterTemplate.DeepCopy()
	}
	if err := r.client.Create(ctx, cluster); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return ctrl.Result{RequeueAfter: r.opts.PollInterval}, nil
		}
		if apierrors.IsInvalid(err) {
			r.fail(rs, "InvalidClusterTemplate", err.Error())
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("creating EtcdCluster %s: %w", cluster.Name, err)
	}
	st := &rs.Status
	st.Phase = etcdv1alpha1.EtcdRestorePhaseRunning
	st.StartTime = ptrTime(r.opts.Clock.Now())
	st.RestoredCluster = cluster.Name
	st.RestoredSize = size
	msg := fmt.Sprintf("created EtcdCluster %s from s3://%s/%s", cluster.Name, src.Bucket, src.Key)
	r.setCondition(rs, metav1.ConditionUnknown, ReasonClusterStarting, msg)
	r.event(rs, corev1.EventTypeNormal, "ClusterCreated", "Restore", "Restore started: %s", msg)
	log.FromContext(ctx).Info("Created restored cluster", "cluster", cluster.Name, "key", src.Key)
	return ctrl.Result{RequeueAfter: r.opts.PollInterval}, nil
}

// findSnapshot checks the restore's backup and its last snapshot, which
// must exist, readable with a Secret of the backup's name in the restore's
// namespace (the members read it there). It returns what the cluster's
// members restore from and the snapshot's stored size.
func (r *RestoreReconciler) findSnapshot(ctx context.Context, rs *etcdv1alpha1.EtcdRestore) (restoreSource, int64, error) {
	ns := rs.Spec.BackupNamespace
	if ns == "" {
		ns = rs.Namespace
	}
	b := &etcdv1alpha1.EtcdBackup{}
	if err := r.opts.APIReader.Get(ctx, client.ObjectKey{Namespace: ns, Name: rs.Spec.BackupName}, b); err != nil {
		if apierrors.IsNotFound(err) {
			return restoreSource{}, 0, badInput(ReasonBackupNotFound, "EtcdBackup %s/%s not found", ns, rs.Spec.BackupName)
		}
		return restoreSource{}, 0, fmt.Errorf("reading EtcdBackup %s/%s: %w", ns, rs.Spec.BackupName, err)
	}
	if b.Spec.StorageType != etcdv1alpha1.BackupStorageS3 || b.Spec.S3 == nil {
		return restoreSource{}, 0, badInput(ReasonStorageNotSupported, "EtcdBackup %s/%s is not stored in S3", ns, b.Name)
	}
	prefix := "s3://" + b.Spec.S3.Bucket + "/"
	if b.Status.CompletionTime == nil || !strings.HasPrefix(b.Status.StoragePath, prefix) {
		return restoreSource{}, 0, badInput(ReasonBackupNotCompleted, "EtcdBackup %s/%s has no completed snapshot yet", ns, b.Name)
	}
	key := strings.TrimPrefix(b.Status.StoragePath, prefix)
	store, err := openS3(ctx, r.opts.APIReader, rs.Namespace, b.Spec.S3)
	if err != nil {
		return restoreSource{}, 0, err
	}
	info, err := store.client.StatObject(ctx, store.bucket, key, minio.StatObjectOptions{})
	if err != nil {
		if minio.ToErrorResponse(err).StatusCode == 404 {
			return restoreSource{}, 0, badInput(ReasonSnapshotNotFound, "snapshot %s is not in the store", b.Status.StoragePath)
		}
		return restoreSource{}, 0, fmt.Errorf("checking %s: %w", b.Status.StoragePath, err)
	}
	return restoreSource{
		Restore: rs.Name, RestoreUID: rs.UID, Image: r.opts.Image,
		Endpoint: b.Spec.S3.Endpoint, Region: b.Spec.S3.Region, Bucket: b.Spec.S3.Bucket, Key: key,
		CredentialsSecret: b.Spec.S3.CredentialsSecret, SkipHashCheck: rs.Spec.SkipHashCheck,
	}, info.Size, nil
}

// follow waits for the restored cluster to run.
func (r *RestoreReconciler) follow(ctx context.Context, rs *etcdv1alpha1.EtcdRestore, c *etcdv1alpha1.EtcdCluster) (ctrl.Result, error) {
	st := &rs.Status
	st.RestoredCluster = c.Name
	if st.StartTime == nil {
		st.StartTime = ptrTime(c.CreationTimestamp.Time)
	}
	if c.Status.Phase != etcdv1alpha1.EtcdClusterPhaseRunning {
		st.Phase = etcdv1alpha1.EtcdRestorePhaseRunning
		phase := string(c.Status.Phase)
		if phase == "" {
			phase = "not yet reconciled"
		}
		r.setCondition(rs, metav1.ConditionUnknown, ReasonClusterStarting, fmt.Sprintf("EtcdCluster %s is %s", c.Name, phase))
		return ctrl.Result{RequeueAfter: r.opts.PollInterval}, nil
	}
	st.Phase = etcdv1alpha1.EtcdRestorePhaseCompleted
	st.CompletionTime = ptrTime(r.opts.Clock.Now())
	msg := fmt.Sprintf("EtcdCluster %s is Running", c.Name)
	r.setCondition(rs, metav1.ConditionTrue, ReasonRestored, msg)
	r.event(rs, corev1.EventTypeNormal, ReasonRestored, "Restore", "Restore completed: %s", msg)
	log.FromContext(ctx).Info("Restore completed", "cluster", c.Name)
	return ctrl.Result{}, nil
}

func (r *RestoreReconciler) fail(rs *etcdv1alpha1.EtcdRestore, reason, msg string) {
	prev := meta.FindStatusCondition(rs.Status.Conditions, etcdv1alpha1.ConditionSucceeded)
	if rs.Status.Phase != etcdv1alpha1.EtcdRestorePhaseFailed || prev == nil || prev.Reason != reason || prev.Message != msg {
		r.event(rs, corev1.EventTypeWarning, reason, "Restore", "Restore failed: %s", msg)
	}
	rs.Status.Phase = etcdv1alpha1.EtcdRestorePhaseFailed
	r.setCondition(rs, metav1.ConditionFalse, reason, msg)
}

func (r *RestoreReconciler) setCondition(rs *etcdv1alpha1.EtcdRestore, status metav1.ConditionStatus, reason, msg string) {
	setStatusCondition(&rs.Status.Conditions, rs.Generation, r.opts.Clock.Now(), etcdv1alpha1.ConditionSucceeded, status, reason, msg)
}

func (r *RestoreReconciler) patchStatus(ctx context.Context, original, rs *etcdv1alpha1.EtcdRestore) error {
	return writeStatus(ctx, r.client, original, rs, equality.Semantic.DeepEqual(original.Status, rs.Status))
}

func (r *RestoreReconciler) event(rs *etcdv1alpha1.EtcdRestore, eventType, reason, action, note string, args ...any) {
	recordEvent(r.recorder, rs, eventType, reason, action, note, args...)
}
