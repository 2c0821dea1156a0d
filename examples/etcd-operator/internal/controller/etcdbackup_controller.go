package controller

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/robfig/cron/v3"
	clientv3 "go.etcd.io/etcd/client/v3"
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

// BackupControllerName names the EtcdBackup controller in logs and metrics.
const BackupControllerName = "etcdbackup"

// Reasons of an EtcdBackup's Succeeded condition besides the bad-input ones.
const (
	ReasonBackupRunning   = "BackupRunning"
	ReasonBackupCompleted = "BackupCompleted"
	ReasonSnapshotFailed  = "SnapshotFailed"
	ReasonUploadFailed    = "UploadFailed"
)

// BackupOptions configures the EtcdBackup reconciler. The zero value is valid.
type BackupOptions struct {
	// APIReader reads what is outside the instance's cache: the backed up
	// EtcdCluster and its pods (a backup is assigned on its own, not with
	// its cluster) and the credentials Secret. Default: the client.
	APIReader client.Reader

	// Wrap wraps the reconciler, e.g. with the instance's drain
	// acknowledgement. Default: none.
	Wrap func(next reconcile.Reconciler) (reconcile.Reconciler, error)

	// Clock decides when a scheduled backup is due and stamps status
	// times. Default: the real clock.
	Clock clock.PassiveClock

	// Endpoints returns the client URLs of a cluster's members.
	// Default: memberEndpoints.
	Endpoints func(c *etcdv1alpha1.EtcdCluster, pods []corev1.Pod) []string

	// EtcdTimeout bounds dialing the cluster's etcd. Default: 5s.
	EtcdTimeout time.Duration

	// BackupTimeout bounds one backup: the snapshot and its upload.
	// Default: 10m.
	BackupTimeout time.Duration

	// RetryInterval is how soon a failed backup is tried again.
	// Default: 30s.
	RetryInterval time.Duration

	// MaxConcurrentReconciles is the number of backups taken at once.
	// Default: 2.
	MaxConcurrentReconciles int
}

func (o BackupOptions) withDefaults(c client.Client) BackupOptions {
	if o.APIReader == nil {
		o.APIReader = c
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
	if o.BackupTimeout <= 0 {
		o.BackupTimeout = 10 * time.Minute
	}
	if o.RetryInterval <= 0 {
		o.RetryInterval = 30 * time.Second
	}
	if o.MaxConcurrentReconciles <= 0 {
		o.MaxConcurrentReconciles = 2
	}
	return o
}

// BackupReconciler takes the snapshots EtcdBackups ask for. Create it with
// NewBackupReconciler.
type BackupReconciler struct {
	client   client.Client
	scheme   *runtime.Scheme
	recorder events.EventRecorder
	opts     BackupOptions
}

// NewBackupReconciler returns a reconciler reading backups through c (a
// manager's client reads from its cache) and reporting events to recorder
// (nil: none).
func NewBackupReconciler(c client.Client, scheme *runtime.Scheme, recorder events.EventRecorder, opts BackupOptions) *BackupReconciler {
	return &BackupReconciler{client: c, scheme: scheme, recorder: recorder, opts: opts.withDefaults(c)}
}

// SetupWithManager registers the controller. The manager's cache must serve
// EtcdBackups. Status writes do not trigger reconciles: the next run of a
// schedule is a RequeueAfter.
func (r *BackupReconciler) SetupWithManager(mgr ctrl.Manager) error {
	wrapped, err := r.opts.Wrap(r)
	if err != nil {
		return fmt.Errorf("wrapping the %s reconciler: %w", BackupControllerName, err)
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named(BackupControllerName).
		For(&etcdv1alpha1.EtcdBackup{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		WithOptions(controller.Options{MaxConcurrentReconciles: r.opts.MaxConcurrentReconciles}).
		Complete(wrapped)
}

// scheduleParser reads spec.schedule: standard cron, with an optional
// leading seconds field, and descriptors (@hourly, @every 1h).
var scheduleParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// +kubebuilder:rbac:groups=etcd.example.sharder.dev,resources=etcdbackups,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=etcd.example.sharder.dev,resources=etcdbackups/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get

// Reconcile takes a backup when one is due: at once for a new one-shot
// backup, at the schedule's next time after the last completed one for a
// scheduled backup, RetryInterval after a failed attempt, and at once when
// the last attempt was cut short (phase Running: its instance stopped).
// The snapshot is counted only once the store holds it whole.
func (r *BackupReconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, retErr error) {
	b := &etcdv1alpha1.EtcdBackup{}
	if err := r.client.Get(ctx, req.NamespacedName, b); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !b.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	original := b.DeepCopy()
	defer func() {
		if err := r.patchStatus(ctx, original, b); err != nil {
			retErr = errors.Join(retErr, err)
		}
	}()

	// Input only a new spec can fix: say so and wait for the spec.
	sched, err := validateBackup(b)
	if err != nil {
		r.fail(b, err)
		return ctrl.Result{}, nil
	}

	now := r.opts.Clock.Now()
	due := nextBackup(b, sched, r.opts.RetryInterval)
	if due.IsZero() {
		return ctrl.Result{}, nil
	}
	if now.Before(due) {
		return ctrl.Result{RequeueAfter: due.Sub(now)}, nil
	}

	// Say Running before starting, so that an attempt cut short shows.
	if b.Status.Phase == etcdv1alpha1.EtcdBackupPhaseRunning {
		r.event(b, corev1.EventTypeNormal, "Restarted", "Backup", "The last attempt did not finish: starting again")
	}
	b.Status.Phase = etcdv1alpha1.EtcdBackupPhaseRunning
	b.Status.StartTime = ptrTime(now)
	b.Status.ObservedGeneration = b.Generation
	r.setCondition(b, metav1.ConditionUnknown, ReasonBackupRunning, "taking a snapshot")
	if err := r.patchStatus(ctx, original, b); err != nil {
		return ctrl.Result{}, err
	}
	original = b.DeepCopy()

	res, err := r.backup(ctx, b, now)
	if err != nil && ctx.Err() != nil {
		// Cancelled (the instance stops or lost the backup): leave it
		// Running for whoever reconciles it next.
		return ctrl.Result{}, ctx.Err()
	}
	if err != nil {
		r.fail(b, err)
		log.FromContext(ctx).Info("Backup failed", "error", err.Error())
		return ctrl.Result{RequeueAfter: r.opts.RetryInterval}, nil
	}
	st := &b.Status
	st.Phase = etcdv1alpha1.EtcdBackupPhaseCompleted
	st.CompletionTime = ptrTime(r.opts.Clock.Now())
	st.BackupSize, st.StoragePath, st.EtcdVersion, st.EtcdRevision = res.size, res.path, res.version, res.revision
	msg := fmt.Sprintf("stored %d bytes at revision %d in %s", res.size, res.revision, res.path)
	r.setCondition(b, metav1.ConditionTrue, ReasonBackupCompleted, msg)
	r.event(b, corev1.EventTypeNormal, ReasonBackupCompleted, "Backup", "Backup completed: %s", msg)
	log.FromContext(ctx).Info("Backup completed", "path", res.path, "size", res.size, "revision", res.revision)

	// A one-shot backup keeps the snapshot its status names, and nothing
	// an earlier attempt may have completed unrecorded (its instance cut off
	// before it could say so).
	keep := int(b.Spec.RetentionPolicy.MaxBackups)
	if sched == nil {
		keep = 1
	}
	if keep > 0 {
		if err := r.prune(ctx, b, res.store, keep); err != nil {
			r.event(b, corev1.EventTypeWarning, "RetentionFailed", "Prune", "Deleting old snapshots: %v", err)
		}
	}
	if sched == nil {
		return ctrl.Result{}, nil
	}
	next := sched.Next(st.CompletionTime.Time)
	return ctrl.Result{RequeueAfter: max(next.Sub(r.opts.Clock.Now()), 0)}, nil
}

// validateBackup returns b's schedule (nil: one-shot), or an inputError for
// a spec the operator cannot act on.
func validateBackup(b *etcdv1alpha1.EtcdBackup) (cron.Schedule, error) {
	if b.Spec.StorageType != etcdv1alpha1.BackupStorageS3 {
		return nil, badInput(ReasonStorageNotSupported, "storage type %q is not supported: use S3", b.Spec.StorageType)
	}
	if b.Spec.S3 == nil {
		return nil, badInput(ReasonStorageNotSupported, "storage type S3 needs spec.s3")
	}
	if _, _, err := s3Endpoint(b.Spec.S3.Endpoint); err != nil {
		return nil, badInput(ReasonInvalidEndpoint, "%w", err)
	}
	if b.Spec.Schedule == "" {
		return nil, nil
	}
	sched, err := scheduleParser.Parse(b.Spec.Schedule)
	if err != nil {
		return nil, badInput(ReasonInvalidSchedule, "schedule %q: %w", b.Spec.Schedule, err)
	}
	return sched, nil
}

// nextBackup is when b's next attempt is due; zero when none is (a
// completed one-shot backup).
func nextBackup(b *etcdv1alpha1.EtcdBackup, sched cron.Schedule, retry time.Duration) time.Time {
	st := b.Status
	if st.Phase == etcdv1alpha1.EtcdBackupPhaseRunning {
		return b.CreationTimestamp.Time
	}
	var due time.Time
	switch {
	case sched == nil && st.Phase == etcdv1alpha1.EtcdBackupPhaseCompleted && st.ObservedGeneration == b.Generation:
		return time.Time{}
	case sched == nil:
		due = b.CreationTimestamp.Time
	case st.CompletionTime != nil:
		due = sched.Next(st.CompletionTime.Time)
	default:
		due = sched.Next(b.CreationTimestamp.Time)
	}
	if st.Phase == etcdv1alpha1.EtcdBackupPhaseFailed && st.StartTime != nil && st.ObservedGeneration == b.Generation {
		if retryAt := st.StartTime.Add(retry); retryAt.After(due) {
			due = retryAt
		}
	}
	return due
}

// backupResult is a stored snapshot.
type backupResult struct {
	store    *s3Store
	path     string
	size     int64
	revision int64
	version  string
}

// backup streams a snapshot of b's cluster into its bucket. The object
// appears only once the upload completes: an upload cut short leaves
// nothing under the key.
func (r *BackupReconciler) backup(ctx context.Context, b *etcdv1alpha1.EtcdBackup, start time.Time) (*backupResult, error) {
	ctx, cancel := context.WithTimeout(ctx, r.opts.BackupTimeout)
	defer cancel()

	ns := b.Spec.ClusterNamespace
	if ns == "" {
		ns = b.Namespace
	}
	cluster := &etcdv1alpha1.EtcdCluster{}
	if err := r.opts.APIReader.Get(ctx, client.ObjectKey{Namespace: ns, Name: b.Spec.ClusterName}, cluster); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, badInput(ReasonClusterNotFound, "EtcdCluster %s/%s not found", ns, b.Spec.ClusterName)
		}
		return nil, fmt.Errorf("reading EtcdCluster %s/%s: %w", ns, b.Spec.ClusterName, err)
	}
	store, err := openS3(ctx, r.opts.APIReader, b.Namespace, b.Spec.S3)
	if err != nil {
		return nil, err
	}

	pods := &corev1.PodList{}
	if err := r.opts.APIReader.List(ctx, pods, client.InNamespace(ns), client.MatchingLabels(selectorLabels(cluster))); err != nil {
		return nil, fmt.Errorf("listing member pods: %w", err)
	}
	access, err := clusterAccess(ctx, r.opts.APIReader, cluster)
	if err != nil {
		return nil, err
	}
	cli, ep, st, err := snapshotMember(ctx, access, r.opts.Endpoints(cluster, pods.Items), r.opts.EtcdTimeout)
	if err != nil {
		return nil, &inputError{Reason: ReasonSnapshotFailed, err: err}
	}
	defer func() { _ = cli.Close() }()
	snap, err := cli.SnapshotWithVersion(ctx)
	if err != nil {
		return nil, &inputError{Reason: ReasonSnapshotFailed, err: fmt.Errorf("etcd snapshot from %s: %w", ep, err)}
	}
	defer func() { _ = snap.Snapshot.Close() }()

	name := start.UTC().Format("20060102T150405Z") + ".db"
	var body io.Reader = snap.Snapshot
	if b.Spec.Compression {
		name += ".gz"
		body = gzipped(snap.Snapshot)
	}
	key := store.key(b.Namespace, b.Name, name)
	info, err := store.client.PutObject(ctx, store.bucket, key, body, -1, minio.PutObjectOptions{
		PartSize: snapshotPartSize, ContentType: "application/octet-stream",
	})
	if err != nil {
		return nil, &inputError{Reason: ReasonUploadFailed, err: fmt.Errorf("storing %s: %w", key, err)}
	}
	return &backupResult{
		store: store, path: "s3://" + store.bucket + "/" + key, size: info.Size,
		version: st.Version, revision: st.Header.GetRevision(),
	}, nil
}

// snapshotMember picks the member a snapshot is taken from: the first of
// endpoints that answers a status request. It returns a client of that
// member alone, its endpoint and its status (its version, and its revision
// just before the snapshot: the snapshot holds at least that revision).
func snapshotMember(ctx context.Context, access etcdAccess, endpoints []string, timeout time.Duration) (*clientv3.Client, string, *clientv3.StatusResponse, error) {
	all, err := newEtcdClient(ctx, access, endpoints, timeout)
	if err != nil {
		return nil, "", nil, err
	}
	defer func() { _ = all.Close() }()
	var errs []error
	for _, ep := range endpoints {
		sctx, cancel := context.WithTimeout(ctx, timeout)
		st, err := all.Status(sctx, ep)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", ep, err))
			continue
		}
		one, err := newEtcdClient(ctx, access, []string{ep}, timeout)
		if err != nil {
			return nil, "", nil, err
		}
		return one, ep, st, nil
	}
	return nil, "", nil, fmt.Errorf("no member answered: %w", errors.Join(errs...))
}

// gzipped compresses r as it is read.
func gzipped(r io.Reader) io.Reader {
	pr, pw := io.Pipe()
	go func() {
		zw := gzip.NewWriter(pw)
		_, err := io.Copy(zw, r)
		if err == nil {
			err = zw.Close()
		}
		pw.CloseWithError(err)
	}()
	return pr
}

// prune deletes the oldest snapshots of b beyond keep. Keys start with the
// start time, so their order is their age.
func (r *BackupReconciler) prune(ctx context.Context, b *etcdv1alpha1.EtcdBackup, store *s3Store, keep int) error {
	prefix := store.key(b.Namespace, b.Name) + "/"
	var keys []string
	for obj := range store.client.ListObjects(ctx, store.bucket, minio.ListObjectsOptions{Prefix: prefix}) {
		if obj.Err != nil {
			return fmt.Errorf("listing %s: %w", prefix, obj.Err)
		}
		if strings.HasSuffix(obj.Key, ".db") || strings.HasSuffix(obj.Key, ".db.gz") {
			keys = append(keys, obj.Key)
		}
	}
	sort.Strings(keys)
	var errs []error
	for _, k := range keys[:max(len(keys)-keep, 0)] {
		if err := store.client.RemoveObject(ctx, store.bucket, k, minio.RemoveObjectOptions{}); err != nil {
			errs = append(errs, fmt.Errorf("deleting %s: %w", k, err))
			continue
		}
		log.FromContext(ctx).Info("Deleted old snapshot", "key", k)
	}
	return errors.Join(errs...)
}

// fail records a failed attempt.
func (r *BackupReconciler) fail(b *etcdv1alpha1.EtcdBackup, err error) {
	reason := ReasonSnapshotFailed
	var ie *inputError
	if errors.As(err, &ie) {
		reason = ie.Reason
	}
	b.Status.ObservedGeneration = b.Generation
	prev := meta.FindStatusCondition(b.Status.Conditions, etcdv1alpha1.ConditionSucceeded)
	if b.Status.Phase != etcdv1alpha1.EtcdBackupPhaseFailed || prev == nil || prev.Reason != reason || prev.Message != err.Error() {
		r.event(b, corev1.EventTypeWarning, reason, "Backup", "Backup failed: %v", err)
	}
	b.Status.Phase = etcdv1alpha1.EtcdBackupPhaseFailed
	r.setCondition(b, metav1.ConditionFalse, reason, err.Error())
}

func (r *BackupReconciler) setCondition(b *etcdv1alpha1.EtcdBackup, status metav1.ConditionStatus, reason, msg string) {
	setStatusCondition(&b.Status.Conditions, b.Generation, r.opts.Clock.Now(), etcdv1alpha1.ConditionSucceeded, status, reason, msg)
}

func (r *BackupReconciler) patchStatus(ctx context.Context, original, b *etcdv1alpha1.EtcdBackup) error {
	return writeStatus(ctx, r.client, original, b, equality.Semantic.DeepEqual(original.Status, b.Status))
}

func (r *BackupReconciler) event(b *etcdv1alpha1.EtcdBackup, eventType, reason, action, note string, args ...any) {
	recordEvent(r.recorder, b, eventType, reason, action, note, args...)
}
