package main

import (
	"context"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"

	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/ring"
)

// The objects mode's creation of objects: over protobuf, many at once,
// retried on the control plane's transient errors.

func protobufClient(cfg *rest.Config) (kubernetes.Interface, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.QPS, cfg.Burst = -1, 0 // no client-side limit: the workers are the limit
	return kubernetes.NewForConfig(cfg)
}

// slimObject keeps what the acknowledger reads of an object.
func slimObject(obj any) (any, error) {
	m, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return obj, nil
	}
	return &metav1.PartialObjectMetadata{TypeMeta: m.TypeMeta, ObjectMeta: metav1.ObjectMeta{
		Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion, Labels: m.Labels,
	}}, nil
}

// create creates the ConfigMaps <from..to) without data and returns how
// many it created and how many of the API server's answers carried the
// ring's shard label. With labelled set, it creates them as the sharder
// with their shard label already set to the instance the ring of the
// fleet's live instances assigns them to, as the assigning webhook would
// (the API server then calls neither webhook).
func (o *objectsRun) create(ctx context.Context, from, to int, labelled bool) (created, carried int, err error) {
	var nCreated, nCarried atomic.Int64
	shard := sharderv1alpha1.ShardLabel(ringName)
	cs := o.creator
	var r ring.Ring
	opts := metav1.CreateOptions{}
	if labelled {
		cs = o.asSharder
		if r, err = o.ring(); err != nil {
			return 0, 0, err
		}
		// The validating webhook lets the sharder's label writes through
		// from the leading replica only, known by its field manager.
		if opts.FieldManager, err = o.leaderFieldManager(ctx); err != nil {
			return 0, 0, err
		}
	}
	configMaps := cs.CoreV1().ConfigMaps(objectNamespace)
	err = parallel(ctx, from, to, o.p.workers, func(i int) error {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: bigObjectName(i)}}
		if r != nil {
			id, err := r.Lookup(ring.ObjectKey(configMapKind.Group, configMapKind.Kind, objectNamespace, cm.Name))
			if err != nil {
				return err
			}
			cm.Labels = map[string]string{shard: id}
		}
		got, err := createRetrying(ctx, configMaps, cm, opts)
		if err != nil {
			return err
		}
		nCreated.Add(1)
		o.created.Add(1)
		if got.Labels[shard] != "" {
			nCarried.Add(1)
		}
		return nil
	})
	o.total += int(nCreated.Load())
	return int(nCreated.Load()), int(nCarried.Load()), err
}

// createBackoff is how often and how long a creation the API server
// refused for a while (overloaded, timed out) is tried again: a million
// creations on a busy machine meet a few such answers, and one must not end
// the run.
var createBackoff = wait.Backoff{Steps: 8, Duration: 500 * time.Millisecond, Factor: 2, Cap: 30 * time.Second}

// createRetrying creates cm, trying again on the API server's transient
// refusals. A creation whose answer was lost may have landed: when the
// next try finds the object, that object is the answer.
func createRetrying(ctx context.Context, configMaps typedcorev1.ConfigMapInterface, cm *corev1.ConfigMap, opts metav1.CreateOptions) (*corev1.ConfigMap, error) {
	var got *corev1.ConfigMap
	tried := false
	err := retry.OnError(createBackoff, transientError, func() error {
		var err error
		got, err = configMaps.Create(ctx, cm, opts)
		if apierrors.IsAlreadyExists(err) && tried {
			got, err = configMaps.Get(ctx, cm.Name, metav1.GetOptions{})
		}
		tried = true
		return err
	})
	return got, err
}

// transientError reports whether err is an answer worth trying again:
// the API server overloaded, timed out or unavailable.
func transientError(err error) bool {
	return apierrors.IsInternalError(err) || apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) ||
		apierrors.IsTooManyRequests(err) || apierrors.IsServiceUnavailable(err)
}
