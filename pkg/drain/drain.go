package drain

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
)

// NoTarget is the drain label's value that names no instance to hand the
// object over to: the acknowledgement then removes both labels and the
// sharder assigns the object. Sharders before the hand-over wrote it on
// every drain; the sharder still writes it for an object with controlled
// objects, which must move before their owner, and for a target whose ID
// is this very value.
const NoTarget = "true"

// Requested reports whether obj carries ring's drain label (any value).
func Requested(obj metav1.Object, ring string) bool {
	_, ok := obj.GetLabels()[v1alpha1.DrainLabel(ring)]
	return ok
}

// Target returns the instance the drain of obj in ring hands the object
// over to: the drain label's value, when the object carries a shard label
// of ring and the value is an instance ID other than NoTarget and other
// than the current instance. It reports false for an object that is not
// draining, and for a drain that names no target (NoTarget, or any other
// value that is not an instance ID): such a drain is acknowledged by
// removing both labels.
func Target(obj metav1.Object, ring string) (string, bool) {
	labels := obj.GetLabels()
	value, draining := labels[v1alpha1.DrainLabel(ring)]
	current, assigned := labels[v1alpha1.ShardLabel(ring)]
	if !draining || !assigned || !IsTarget(value) || value == current {
		return "", false
	}
	return value, true
}

// IsTarget reports whether value, found in a drain label, names an instance
// to hand the object over to: an instance ID (membership.InvalidID) other
// than NoTarget.
func IsTarget(value string) bool {
	return value != NoTarget && membership.InvalidID(value) == nil
}

// RequestPatch returns a JSON merge patch that sets ring's drain label on an
// object whose current resourceVersion is resourceVersion, its value the
// instance target the acknowledgement hands the object over to (Target).
// An empty target, or one that cannot be named (IsTarget), writes NoTarget.
// The API server rejects the patch with a Conflict when the object changed
// since: the caller then re-reads the object and decides again, so a drain
// is never requested on a state the sharder has not seen.
func RequestPatch(ring, resourceVersion, target string) []byte {
	return LabelPatch(resourceVersion, map[string]*string{v1alpha1.DrainLabel(ring): ptr.To(requestValue(target))})
}

// RequestPatchStarted is RequestPatch that also records when the drain
// started, in the annotation v1alpha1.DrainStartedAnnotation: a sharder
// elected while the drain is in flight counts its timeout from there
// (Started).
func RequestPatchStarted(ring, resourceVersion, target string, started time.Time) []byte {
	return MetadataPatch(resourceVersion,
		map[string]*string{v1alpha1.DrainLabel(ring): ptr.To(requestValue(target))},
		map[string]*string{v1alpha1.DrainStartedAnnotation(ring): ptr.To(v1alpha1.FormatDrainStarted(started))})
}

// requestValue is the drain label's value that names target.
func requestValue(target string) string {
	if !IsTarget(target) {
		return NoTarget
	}
	return target
}

// Started returns when the drain of obj in ring started, as the sharder that
// requested it recorded it (RequestPatchStarted); false when obj is not
// draining or carries no valid record (a drain requested by a sharder that
// did not record it).
func Started(obj metav1.Object, ring string) (time.Time, bool) {
	if !Requested(obj, ring) {
		return time.Time{}, false
	}
	value, ok := obj.GetAnnotations()[v1alpha1.DrainStartedAnnotation(ring)]
	if !ok {
		return time.Time{}, false
	}
	return v1alpha1.ParseDrainStarted(value)
}
