package owners

import (
	"errors"
	"fmt"
	"reflect"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/sharder-dev/sharder/pkg/ring"
)

// Errors of key resolution. They are wrapped with the object and owner they
// concern; test with errors.Is.
var (
	// ErrNotRingResource: the object is of neither a main nor a controlled
	// resource of the ring.
	ErrNotRingResource = errors.New("not a resource of the ring")
	// ErrNoController: a controlled object has no controller ownerReference.
	ErrNoController = errors.New("no controller ownerReference")
	// ErrOwnerNotInRing: the controller ownerReference points to a kind that
	// is neither a main nor a controlled resource of the ring.
	ErrOwnerNotInRing = errors.New("controller is not a resource of the ring")
	// ErrOwnerUnknown: the controller is of a ring resource but is not known
	// (not in the cache yet, deleted, or recreated with another UID). The
	// object stays unassigned until its owner shows up.
	ErrOwnerUnknown = errors.New("controller unknown")
	// ErrOwnershipCycle: following controllers leads back to an object
	// already on the chain, or the chain is longer than MaxOwnerDepth.
	ErrOwnershipCycle = errors.New("controller ownership cycle")
	// ErrInvalidObject: the object is nil or has no name.
	ErrInvalidObject = errors.New("invalid object")
)

// MaxOwnerDepth is how many controller ownerReferences Root follows at most.
const MaxOwnerDepth = 32

// ObjectRef identifies an object of a ring's resources.
type ObjectRef struct {
	schema.GroupKind
	Namespace string
	Name      string
}

// Key returns the hash key of the referenced object.
func (r ObjectRef) Key() string { return ring.ObjectKey(r.Group, r.Kind, r.Namespace, r.Name) }

// String returns "<Kind>.<group> <namespace>/<name>" for messages.
func (r ObjectRef) String() string {
	if r.Namespace == "" {
		return r.GroupKind.String() + " " + r.Name
	}
	return r.GroupKind.String() + " " + r.Namespace + "/" + r.Name
}

// Resolver finds the hash key of objects of a ring's resources: a main
// object's own key, or for a controlled object the key of the main object at
// the top of its chain of controllers. It only reads object metadata through
// its functions; nil functions are treated as answering false. Resolver
// values are safe for concurrent use when their functions are.
type Resolver struct {
	// IsMain reports whether gk is the kind of one of the ring's main
	// resources.
	IsMain func(gk schema.GroupKind) bool
	// IsControlled reports whether gk is the kind of one of the ring's
	// controlled resources.
	IsControlled func(gk schema.GroupKind) bool
	// Lookup returns the metadata of an object of the ring's resources,
	// false if unknown. Owners are looked up in the namespace of the object
	// that references them; Lookup should ignore namespace for
	// cluster-scoped kinds.
	Lookup func(gk schema.GroupKind, namespace, name string) (metav1.Object, bool)
}

// Key returns the hash key of obj (of kind gk): its own key if main, its
// controller chain's main object's key if controlled.
func (r Resolver) Key(gk schema.GroupKind, obj metav1.Object) (string, error) {
	root, err := r.Root(gk, obj)
	if err != nil {
		return "", err
	}
	return root.Key(), nil
}

// Root returns the main object at the top of obj's chain of controllers: obj
// itself if gk is a main resource. Each step follows the ownerReference with
// controller: true, whose group comes from its apiVersion and which lives in
// the child's namespace or is cluster-scoped (Lookup tells which: the
// returned owner's namespace is taken), while the owner is a controlled
// resource of the ring. A kind that is both main and controlled counts as main. When an
// ownerReference carries a UID, the owner Lookup returns must have it.
func (r Resolver) Root(gk schema.GroupKind, obj metav1.Object) (ObjectRef, error) {
	if isNil(obj) {
		return ObjectRef{}, fmt.Errorf("%w: no object of kind %s", ErrInvalidObject, gk)
	}
	ref := ObjectRef{GroupKind: gk, Namespace: obj.GetNamespace(), Name: obj.GetName()}
	if ref.Name == "" {
		return ObjectRef{}, fmt.Errorf("%w: %s has no name", ErrInvalidObject, ref)
	}
	if !call(r.IsMain, gk) && !call(r.IsControlled, gk) {
		return ObjectRef{}, fmt.Errorf("%s: %w", ref, ErrNotRingResource)
	}
	seen := map[ObjectRef]bool{}
	for depth := 0; ; depth++ {
		if call(r.IsMain, ref.GroupKind) {
			return ref, nil
		}
		if depth >= MaxOwnerDepth {
			return ObjectRef{}, fmt.Errorf("%s: %w: more than %d controllers deep", ref, ErrOwnershipCycle, MaxOwnerDepth)
		}
		seen[ref] = true
		owner := metav1.GetControllerOfNoCopy(obj)
		if owner == nil {
			return ObjectRef{}, fmt.Errorf("%s: %w", ref, ErrNoController)
		}
		gv, err := schema.ParseGroupVersion(owner.APIVersion)
		if err != nil {
			return ObjectRef{}, fmt.Errorf("%s: controller %s %q: %w: malformed apiVersion %q", ref, owner.Kind, owner.Name, ErrOwnerNotInRing, owner.APIVersion)
		}
		next := ObjectRef{GroupKind: schema.GroupKind{Group: gv.Group, Kind: owner.Kind}, Namespace: ref.Namespace, Name: owner.Name}
		if !call(r.IsMain, next.GroupKind) && !call(r.IsControlled, next.GroupKind) {
			return ObjectRef{}, fmt.Errorf("%s: controller %s: %w", ref, next, ErrOwnerNotInRing)
		}
		if seen[next] {
			return ObjectRef{}, fmt.Errorf("%s: controller %s: %w", ref, next, ErrOwnershipCycle)
		}
		var found metav1.Object
		var ok bool
		if r.Lookup != nil && next.Name != "" {
			found, ok = r.Lookup(next.GroupKind, next.Namespace, next.Name)
		}
		if !ok || isNil(found) {
			return ObjectRef{}, fmt.Errorf("%s: controller %s: %w", ref, next, ErrOwnerUnknown)
		}
		if owner.UID != "" && found.GetUID() != "" && owner.UID != found.GetUID() {
			return ObjectRef{}, fmt.Errorf("%s: controller %s: %w: UID %s, reference wants %s", ref, next, ErrOwnerUnknown, found.GetUID(), owner.UID)
		}
		// The owner's namespace is its own: a namespaced object may be
		// controlled by a cluster-scoped one.
		next.Namespace = found.GetNamespace()
		ref, obj = next, found
	}
}

func call(f func(schema.GroupKind) bool, gk schema.GroupKind) bool { return f != nil && f(gk) }

// isNil reports whether obj is nil or a typed nil pointer.
func isNil(obj metav1.Object) bool {
	if obj == nil {
		return true
	}
	v := reflect.ValueOf(obj)
	return v.Kind() == reflect.Pointer && v.IsNil()
}
