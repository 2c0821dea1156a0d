package webhook

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// TestRingSpecChanged: a write of a ring's status alone does not make the
// configuration writer read every ring again; a change of spec, identity or
// deletion does.
func TestRingSpecChanged(t *testing.T) {
	old := &v1alpha1.ControllerRing{ObjectMeta: metav1.ObjectMeta{Name: "r", UID: "1", Generation: 1}}
	statusOnly := old.DeepCopy()
	statusOnly.ResourceVersion = "2"
	statusOnly.Status.Members = []v1alpha1.MemberStatus{{Name: "a"}}
	spec := old.DeepCopy()
	spec.Generation = 2
	recreated := old.DeepCopy()
	recreated.UID = "2"
	deleted := old.DeepCopy()
	now := metav1.Now()
	deleted.DeletionTimestamp = &now
	for name, tc := range map[string]struct {
		ring *v1alpha1.ControllerRing
		want bool
	}{
		"status only": {statusOnly, false},
		"spec":        {spec, true},
		"recreated":   {recreated, true},
		"deleted":     {deleted, true},
	} {
		if got := ringSpecChanged.Update(event.UpdateEvent{ObjectOld: old, ObjectNew: tc.ring}); got != tc.want {
			t.Errorf("%s: passes = %t, want %t", name, got, tc.want)
		}
	}
	if !ringSpecChanged.Create(event.CreateEvent{Object: old}) || !ringSpecChanged.Delete(event.DeleteEvent{Object: old}) {
		t.Error("a ring created or deleted does not pass")
	}
}
