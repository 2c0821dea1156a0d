package assign

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// event records an event on the ring. The recorder writes each distinct
// note as its own Event at once (see pkg/sharder/eventrecorder).
func (r *ringAssigner) event(eventType, reason, note string, args ...any) {
	cfg := r.cfg.Load()
	ref := &v1alpha1.ControllerRing{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "ControllerRing"},
		ObjectMeta: metav1.ObjectMeta{Name: r.name, UID: cfg.uid},
	}
	r.c.recorder.Eventf(ref, eventType, reason, note, args...)
}

// eventReadyChange records an event when a resource of the ring can no
// longer be used (or another problem replaces it), and when every resource
// can be used again: a ring that loses a resource after it started, to a
// deleted CustomResourceDefinition or a revoked permission, deserves more
// than a condition. Both units' status writers call it.
func eventReadyChange(c *Controller, ring *v1alpha1.ControllerRing, old, cur *metav1.Condition) {
	switch {
	case cur == nil:
	case resourceProblem(cur.Reason):
		if old == nil || old.Reason != cur.Reason || old.Message != cur.Message {
			c.ringEvent(ring, corev1.EventTypeWarning, cur.Reason, "%s", cur.Message)
		}
	case old != nil && resourceProblem(old.Reason):
		c.ringEvent(ring, corev1.EventTypeNormal, "ResourcesAvailable", "Every resource of the ring can be listed, watched and patched again.")
	}
}

// resourceProblem reports whether reason says that a resource of the ring
// cannot be used.
func resourceProblem(reason string) bool {
	return reason == v1alpha1.ReasonResourceNotServed || reason == v1alpha1.ReasonResourceForbidden
}
