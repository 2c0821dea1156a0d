package assign

import (
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
