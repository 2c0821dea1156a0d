package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/drain"
)

// acknowledger answers the drains of a fleet's instances, the way
// pkg/instance does for one instance: when an object of the ring's
// namespace carries the drain label and its shard label names a running
// member of the fleet, it acknowledges the drain with drain.Acknowledge
// (handing the object over to the drain's target), reading the object again
// on a conflict. One metadata watch serves the whole fleet, where each real
// instance would watch its own objects.
//
// It also records every change of an object's shard or drain label, with
// the time the watch delivered it, so that a membership change can be timed
// to the first object it moved (labelEvents).
type acknowledger struct {
	client   client.Client
	fleet    *fleet
	ring     string
	informer cache.SharedIndexInformer
	queue    workqueue.TypedRateLimitingInterface[string]

	mu     sync.Mutex
	last   map[string]labelState
	events []labelEvent
}

// labelState is an object's shard and drain labels of the ring.
type labelState struct {
	instance string
	draining bool
}

// labelEvent is one change of an object's labels, as the watch delivered it.
type labelEvent struct {
	at       time.Time
	key      string
	from, to labelState
}

// acknowledgeWorkers is how many drains the acknowledger answers at once: a
// real instance answers its own drains with its controllers' workers.
const acknowledgeWorkers = 8

func newAcknowledger(admin *rest.Config, f *fleet, namespace, ring string) (*acknowledger, error) {
	mc, err := metadata.NewForConfig(admin)
	if err != nil {
		return nil, fmt.Errorf("creating metadata client: %w", err)
	}
	a := &acknowledger{
		client: f.client, fleet: f, ring: ring, last: map[string]labelState{},
		queue: workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]()),
	}
	a.informer = metadatainformer.NewFilteredMetadataInformer(mc, configMaps, namespace, 0, cache.Indexers{}, nil).Informer()
	_, err = a.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { a.observe(obj) },
		UpdateFunc: func(_, obj any) { a.observe(obj) },
	})
	if err != nil {
		return nil, err
	}
	return a, nil
}

// start runs the watch and the workers until ctx ends and waits for the
// first list.
func (a *acknowledger) start(ctx context.Context) error {
	go a.informer.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), a.informer.HasSynced) {
		return errors.New("the acknowledger's watch did not sync")
	}
	go func() {
		<-ctx.Done()
		a.queue.ShutDown()
	}()
	for range acknowledgeWorkers {
		go func() {
			for a.next(ctx) {
			}
		}()
	}
	return nil
}

func (a *acknowledger) observe(obj any) {
	now := time.Now()
	m, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return
	}
	key := m.Namespace + "/" + m.Name
	state := labelState{instance: m.Labels[sharderv1alpha1.ShardLabel(a.ring)], draining: drain.Requested(m, a.ring)}
	a.mu.Lock()
	if prev := a.last[key]; prev != state {
		a.events = append(a.events, labelEvent{at: now, key: key, from: prev, to: state})
		a.last[key] = state
	}
	a.mu.Unlock()
	if state.draining && a.fleet.acknowledges(state.instance) {
		a.queue.Add(key)
	}
}

// labelEvents returns the label changes recorded at or after since.
func (a *acknowledger) labelEvents(since time.Time) []labelEvent {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []labelEvent
	for i := len(a.events) - 1; i >= 0 && !a.events[i].at.Before(since); i-- {
		out = append(out, a.events[i])
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}

// ownedBy returns the keys of the objects whose shard label names id.
func (a *acknowledger) ownedBy(id string) map[string]bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	keys := map[string]bool{}
	for k, s := range a.last {
		if s.instance == id {
			keys[k] = true
		}
	}
	return keys
}

func (a *acknowledger) next(ctx context.Context) bool {
	key, shutdown := a.queue.Get()
	if shutdown {
		return false
	}
	defer a.queue.Done(key)
	if err := a.acknowledge(ctx, key); err != nil && ctx.Err() == nil {
		a.queue.AddRateLimited(key)
		return true
	}
	a.queue.Forget(key)
	return true
}

// acknowledgeAttempts bounds the reads again after conflicts, as in
// pkg/instance.
const acknowledgeAttempts = 3

func (a *acknowledger) acknowledge(ctx context.Context, key string) error {
	item, exists, err := a.informer.GetStore().GetByKey(key)
	if err != nil || !exists {
		return err
	}
	cached, ok := item.(*metav1.PartialObjectMetadata)
	if !ok {
		return nil
	}
	obj := cached.DeepCopy()
	for attempt := 1; ; attempt++ {
		if !drain.Requested(obj, a.ring) || !a.fleet.acknowledges(obj.Labels[sharderv1alpha1.ShardLabel(a.ring)]) {
			return nil // withdrawn, moved, or its instance no longer runs
		}
		obj.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("ConfigMap"))
		err := drain.Acknowledge(ctx, a.client, obj, a.ring)
		switch {
		case err == nil, apierrors.IsNotFound(err):
			return nil
		case !apierrors.IsConflict(err) || attempt == acknowledgeAttempts:
			return err
		}
		live := &metav1.PartialObjectMetadata{}
		live.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("ConfigMap"))
		if err := a.client.Get(ctx, client.ObjectKey{Namespace: obj.Namespace, Name: obj.Name}, live); err != nil {
			return client.IgnoreNotFound(err)
		}
		obj = live
	}
}
