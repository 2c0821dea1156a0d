package metacache

import (
	"strings"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// ObjectTransform turns the metadata of a ring's objects into Objects. One
// ObjectTransform serves every cache of a ring, so that the values its
// objects have in common are kept once: most objects of a ring carry one of
// a handful of label sets (one per instance), a few namespaces and a few
// owner kinds. It is safe for concurrent use.
type ObjectTransform struct {
	shardLabel, drainLabel, drainStarted string
	shared                               interner
}

// NewObjectTransform returns the transform of the objects of ring.
func NewObjectTransform(ring string) *ObjectTransform {
	return &ObjectTransform{
		shardLabel:   v1alpha1.ShardLabel(ring),
		drainLabel:   v1alpha1.DrainLabel(ring),
		drainStarted: v1alpha1.DrainStartedAnnotation(ring),
	}
}

// Transform keeps only what assignment needs of an object of the ring:
// name, namespace, uid, resourceVersion, the ring's shard and drain labels,
// the ring's drain start annotation while the drain label is there, the
// controller ownerReference, and the deletion timestamp. It is idempotent and copies nothing it
// drops: anything but a PartialObjectMetadata is returned as it is.
//
// The kept namespace, ownerReference apiVersion and kind, and the label map
// itself are shared between cached objects. Cached objects are never
// mutated, so sharing is safe.
func (t *ObjectTransform) Transform(obj any) (any, error) {
	m, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return obj, nil
	}
	out := &Object{
		Name:            m.Name,
		Namespace:       t.shared.str(m.Namespace),
		UID:             m.UID,
		ResourceVersion: m.ResourceVersion,
	}
	shard, hasShard := m.Labels[t.shardLabel]
	drainValue, hasDrain := m.Labels[t.drainLabel]
	out.Labels = t.shared.labels(t.shardLabel, shard, hasShard, t.drainLabel, drainValue, hasDrain)
	if started, ok := m.Annotations[t.drainStarted]; ok && hasDrain {
		out.Annotations = map[string]string{t.drainStarted: strings.Clone(started)}
	}
	if m.DeletionTimestamp != nil {
		out.DeletionTimestamp = m.DeletionTimestamp.DeepCopy()
	}
	if ref := metav1.GetControllerOfNoCopy(m); ref != nil {
		kept := *ref
		kept.APIVersion = t.shared.str(ref.APIVersion)
		kept.Kind = t.shared.str(ref.Kind)
		out.OwnerReferences = []metav1.OwnerReference{kept}
	}
	return out, nil
}

// maxShared bounds the entries of an interner: beyond it, values are kept
// unshared rather than grown without limit.
const maxShared = 1 << 14

// interner hands out one copy of equal strings and label maps so that the
// cached objects of a ring do not each hold their own. It is safe for
// concurrent use. The maps it returns must not be modified.
type interner struct {
	mu        sync.Mutex
	strs      map[string]string
	labelMaps map[labelSet]map[string]string // the shared map of each label set
}

// labelSet is the ring's labels of one object.
type labelSet struct {
	shard, drain       string
	hasShard, hasDrain bool
}

// str returns the shared copy of s.
func (v *interner) str(s string) string {
	if s == "" {
		return ""
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if c, ok := v.strs[s]; ok {
		return c
	}
	if v.strs == nil {
		v.strs = map[string]string{}
	}
	if len(v.strs) < maxShared {
		s = strings.Clone(s)
		v.strs[s] = s
	}
	return s
}

// labels returns a map holding shardKey=shard when hasShard and
// drainKey=drain when hasDrain, nil when neither. The keys are the ring's,
// the same for every call.
func (v *interner) labels(shardKey, shard string, hasShard bool, drainKey, drain string, hasDrain bool) map[string]string {
	if !hasShard && !hasDrain {
		return nil
	}
	set := labelSet{shard: shard, drain: drain, hasShard: hasShard, hasDrain: hasDrain}
	v.mu.Lock()
	defer v.mu.Unlock()
	if m, ok := v.labelMaps[set]; ok {
		return m
	}
	m := make(map[string]string, 2)
	if hasShard {
		m[shardKey] = strings.Clone(shard)
	}
	if hasDrain {
		m[drainKey] = strings.Clone(drain)
	}
	if v.labelMaps == nil {
		v.labelMaps = map[labelSet]map[string]string{}
	}
	if len(v.labelMaps) < maxShared {
		set.shard, set.drain = strings.Clone(shard), strings.Clone(drain)
		v.labelMaps[set] = m
	}
	return m
}

// transformNamespace keeps a Namespace's name and labels (for the ring's
// namespaceSelector).
func transformNamespace(obj any) (any, error) {
	m, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return obj, nil
	}
	return &metav1.PartialObjectMetadata{
		ObjectMeta: metav1.ObjectMeta{
			Name:            m.Name,
			UID:             m.UID,
			ResourceVersion: m.ResourceVersion,
			Labels:          m.Labels,
		},
	}, nil
}

// indexByController indexes an object under its controller's UID.
func indexByController(obj any) ([]string, error) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return nil, nil
	}
	if ref := metav1.GetControllerOfNoCopy(m); ref != nil && ref.UID != "" {
		return []string{string(ref.UID)}, nil
	}
	return nil, nil
}
