package metacache

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

// Object is what a Cache keeps of one main or controlled object of a ring:
// the fields assignment reads and nothing else. It takes 112 bytes (one
// allocation of Go's 112-byte size class) where a PartialObjectMetadata
// takes 264 (288 once allocated), for every object of every ring.
//
// It implements metav1.Object so that the informers' key functions and the
// ring's owner resolver can read it. Cached objects are never modified: the
// setters exist for the interface only and change nothing that is not a
// field here.
type Object struct {
	Name            string
	Namespace       string
	UID             types.UID
	ResourceVersion string
	// Labels holds the ring's shard and drain labels only, nil when the
	// object has neither. The map may be shared with other objects.
	Labels map[string]string
	// OwnerReferences holds the controller reference only.
	OwnerReferences []metav1.OwnerReference
	// Annotations holds the ring's drain start annotation only
	// (v1alpha1.DrainStartedAnnotation), and only while the object carries
	// the ring's drain label; nil otherwise.
	Annotations map[string]string
	// DeletionTimestamp is the object's, nil unless it is being deleted
	// (the slot labeler leaves such objects alone). The pointer fits in the
	// size class the other fields need already.
	DeletionTimestamp *metav1.Time
}

var (
	_ metav1.Object  = &Object{}
	_ runtime.Object = &Object{}
)

// ControllerUID returns the UID of the object's controller, empty when it
// has none.
func (o *Object) ControllerUID() types.UID {
	if ref := metav1.GetControllerOfNoCopy(o); ref != nil {
		return ref.UID
	}
	return ""
}

func (o *Object) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

func (o *Object) DeepCopyObject() runtime.Object {
	c := *o
	if o.Labels != nil {
		c.Labels = make(map[string]string, len(o.Labels))
		for k, v := range o.Labels {
			c.Labels[k] = v
		}
	}
	if o.Annotations != nil {
		c.Annotations = make(map[string]string, len(o.Annotations))
		for k, v := range o.Annotations {
			c.Annotations[k] = v
		}
	}
	if o.DeletionTimestamp != nil {
		c.DeletionTimestamp = o.DeletionTimestamp.DeepCopy()
	}
	if o.OwnerReferences != nil {
		c.OwnerReferences = make([]metav1.OwnerReference, len(o.OwnerReferences))
		for i := range o.OwnerReferences {
			o.OwnerReferences[i].DeepCopyInto(&c.OwnerReferences[i])
		}
	}
	return &c
}

func (o *Object) GetNamespace() string                          { return o.Namespace }
func (o *Object) SetNamespace(namespace string)                 { o.Namespace = namespace }
func (o *Object) GetName() string                               { return o.Name }
func (o *Object) SetName(name string)                           { o.Name = name }
func (o *Object) GetGenerateName() string                       { return "" }
func (o *Object) SetGenerateName(string)                        {}
func (o *Object) GetUID() types.UID                             { return o.UID }
func (o *Object) SetUID(uid types.UID)                          { o.UID = uid }
func (o *Object) GetResourceVersion() string                    { return o.ResourceVersion }
func (o *Object) SetResourceVersion(version string)             { o.ResourceVersion = version }
func (o *Object) GetGeneration() int64                          { return 0 }
func (o *Object) SetGeneration(int64)                           {}
func (o *Object) GetSelfLink() string                           { return "" }
func (o *Object) SetSelfLink(string)                            {}
func (o *Object) GetCreationTimestamp() metav1.Time             { return metav1.Time{} }
func (o *Object) SetCreationTimestamp(metav1.Time)              {}
func (o *Object) GetDeletionTimestamp() *metav1.Time            { return o.DeletionTimestamp }
func (o *Object) SetDeletionTimestamp(t *metav1.Time)           { o.DeletionTimestamp = t }
func (o *Object) GetDeletionGracePeriodSeconds() *int64         { return nil }
func (o *Object) SetDeletionGracePeriodSeconds(*int64)          {}
func (o *Object) GetLabels() map[string]string                  { return o.Labels }
func (o *Object) SetLabels(labels map[string]string)            { o.Labels = labels }
func (o *Object) GetAnnotations() map[string]string             { return o.Annotations }
func (o *Object) SetAnnotations(annotations map[string]string)  { o.Annotations = annotations }
func (o *Object) GetFinalizers() []string                       { return nil }
func (o *Object) SetFinalizers([]string)                        {}
func (o *Object) GetManagedFields() []metav1.ManagedFieldsEntry { return nil }
func (o *Object) SetManagedFields([]metav1.ManagedFieldsEntry)  {}

func (o *Object) GetOwnerReferences() []metav1.OwnerReference { return o.OwnerReferences }
func (o *Object) SetOwnerReferences(references []metav1.OwnerReference) {
	o.OwnerReferences = references
}
