package localrun

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/drain"
)

// Watched is what a LabelWatch knows of one object.
type Watched struct {
	ObjectState
	// FirstSeen is when the watch first saw the object.
	FirstSeen time.Time
	// FirstAssigned is when the watch first saw a shard label on it.
	FirstAssigned time.Time
	// Changed is when the watch last saw its shard label change.
	Changed time.Time
}

// LabelWatch watches the metadata of one resource and records, as they
// arrive, each object's shard and drain labels of a ring and when they
// changed. Times are when the watch event reached the watch, so they
// include the API server's watch delay, as any instance would see it.
type LabelWatch struct {
	ring     string
	informer cache.SharedIndexInformer

	mu      sync.Mutex
	objects map[string]*Watched
	changed chan struct{}
}

// NewLabelWatch returns a watch of gvr in namespace ("" for all) for ring.
// Call Start before reading it.
func NewLabelWatch(cfg *rest.Config, gvr schema.GroupVersionResource, namespace, ring string) (*LabelWatch, error) {
	mc, err := metadata.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating metadata client: %w", err)
	}
	t := &LabelWatch{ring: ring, objects: map[string]*Watched{}, changed: make(chan struct{})}
	t.informer = metadatainformer.NewFilteredMetadataInformer(mc, gvr, namespace, 0, cache.Indexers{}, nil).Informer()
	_, err = t.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { t.observe(obj, false) },
		UpdateFunc: func(_, obj any) { t.observe(obj, false) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			t.observe(obj, true)
		},
	})
	if err != nil {
		return nil, err
	}
	return t, nil
}

// Start runs the watch until ctx ends and waits for the first list.
func (t *LabelWatch) Start(ctx context.Context) error {
	go t.informer.Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), t.informer.HasSynced) {
		return fmt.Errorf("tracker of ring %s: watch did not sync", t.ring)
	}
	return nil
}

func (t *LabelWatch) observe(obj any, deleted bool) {
	now := time.Now()
	m, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return
	}
	key := m.Namespace + "/" + m.Name
	t.mu.Lock()
	defer t.mu.Unlock()
	if deleted {
		delete(t.objects, key)
	} else {
		labels := m.Labels
		instance := labels[sharderv1alpha1.ShardLabel(t.ring)]
		o := t.objects[key]
		if o == nil {
			o = &Watched{FirstSeen: now}
			t.objects[key] = o
		}
		if instance != o.Instance {
			o.Changed = now
			if o.FirstAssigned.IsZero() && instance != "" {
				o.FirstAssigned = now
			}
		}
		o.ObjectState = ObjectState{Key: key, Instance: instance,
			Draining: drain.Requested(m, t.ring), Generation: m.Generation}
	}
	close(t.changed)
	t.changed = make(chan struct{})
}

// Get returns what the watch knows of namespace/name.
func (t *LabelWatch) Get(key string) (Watched, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	o, ok := t.objects[key]
	if !ok {
		return Watched{}, false
	}
	return *o, true
}

// Snapshot returns every tracked object, sorted by key.
func (t *LabelWatch) Snapshot() []Watched {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]Watched, 0, len(t.objects))
	for _, o := range t.objects {
		out = append(out, *o)
	}
	slices.SortFunc(out, func(a, b Watched) int { return strings.Compare(a.Key, b.Key) })
	return out
}

// Assignment returns the current labels of every tracked object.
func (t *LabelWatch) Assignment() Assignment {
	snap := t.Snapshot()
	a := make(Assignment, len(snap))
	for i, o := range snap {
		a[i] = o.ObjectState
	}
	return a
}

// waitCheckInterval is the least time between two checks of a Wait
// condition. Each check copies and sorts every tracked object; checking
// after every single watch event would cost this process a core while
// thousands of objects change, taken from the API server it measures. The
// times a condition reads (FirstSeen, Changed, ...) are taken as events
// arrive, so checking less often does not change them.
const waitCheckInterval = 50 * time.Millisecond

// Wait blocks until cond holds for the tracked objects or ctx ends; cond
// is checked after a change, at most once per waitCheckInterval.
func (t *LabelWatch) Wait(ctx context.Context, cond func([]Watched) error) error {
	for {
		t.mu.Lock()
		ch := t.changed
		t.mu.Unlock()
		err := cond(t.Snapshot())
		if err == nil {
			return nil
		}
		pause := time.NewTimer(waitCheckInterval)
		select {
		case <-pause.C:
		case <-ctx.Done():
			pause.Stop()
			return fmt.Errorf("%w: %w", ctx.Err(), err)
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", ctx.Err(), err)
		}
	}
}

// AllAssigned is a Wait condition: n objects tracked, each assigned to one
// of instances (any instance when none given) and none draining.
func AllAssigned(n int, instances ...string) func([]Watched) error {
	return func(objs []Watched) error {
		if len(objs) != n {
			return fmt.Errorf("%d objects tracked, want %d", len(objs), n)
		}
		a := make(Assignment, len(objs))
		for i, o := range objs {
			a[i] = o.ObjectState
		}
		return a.Settled(instances...)
	}
}
