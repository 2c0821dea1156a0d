package leasecontroller

import (
	"testing"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// TestChangedMembers checks which Leases a write of a ring's status alone
// concerns: those whose member entry changed, appeared or went, and the
// dead ones when the ring gained its first ready instance or lost its last.
func TestChangedMembers(t *testing.T) {
	ring := func(available int32, members ...v1alpha1.MemberStatus) *v1alpha1.ControllerRing {
		return &v1alpha1.ControllerRing{
			ObjectMeta: metav1.ObjectMeta{Name: "r"},
			Spec:       v1alpha1.ControllerRingSpec{LeaseNamespace: "ns"},
			Status:     v1alpha1.ControllerRingStatus{AvailableInstances: available, Members: members},
		}
	}
	member := func(name, state string, objects int32) v1alpha1.MemberStatus {
		return v1alpha1.MemberStatus{Name: name, State: state, Objects: objects}
	}
	names := func(requests []reconcile.Request) []string {
		var out []string
		for _, r := range requests {
			if r.Namespace != "ns" {
				t.Errorf("request %v outside the ring's lease namespace", r)
			}
			out = append(out, r.Name)
		}
		return out
	}
	for _, tc := range []struct {
		name     string
		old, new *v1alpha1.ControllerRing
		want     []string
	}{{
		name: "nothing changed",
		old:  ring(2, member("a", "ready", 3), member("b", "ready", 4)),
		new:  ring(2, member("a", "ready", 3), member("b", "ready", 4)),
	}, {
		name: "one count changed",
		old:  ring(2, member("a", "ready", 3), member("b", "ready", 4), member("c", "dead", 5)),
		new:  ring(2, member("a", "ready", 3), member("b", "ready", 4), member("c", "dead", 4)),
		want: []string{"c"},
	}, {
		name: "one state changed, one member joined, one left",
		old:  ring(1, member("a", "ready", 3), member("b", "expired", 4), member("gone", "dead", 0)),
		new:  ring(1, member("a", "ready", 3), member("b", "uncertain", 4), member("c", "ready", 0)),
		want: []string{"b", "c", "gone"},
	}, {
		name: "the first ready instance: every dead member",
		old:  ring(0, member("a", "restarting", 0), member("b", "dead", 4), member("c", "dead", 2)),
		new:  ring(1, member("a", "ready", 0), member("b", "dead", 4), member("c", "dead", 2)),
		want: []string{"a", "b", "c"},
	}, {
		name: "the last ready instance went: every dead member",
		old:  ring(1, member("a", "ready", 0), member("b", "dead", 4), member("c", "expired", 2)),
		new:  ring(0, member("a", "expired", 0), member("b", "dead", 4), member("c", "expired", 2)),
		want: []string{"a", "b"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			NewWithT(t).Expect(names(changedMembers(tc.old, tc.new))).To(ConsistOf(tc.want))
		})
	}
}

// TestRenewalOnly checks that only a change of renewTime counts as a mere
// renewal.
func TestRenewalOnly(t *testing.T) {
	g := NewWithT(t)
	base := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a", UID: "u", ResourceVersion: "1",
			Labels: map[string]string{v1alpha1.LabelRing: "r"}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("a"), LeaseDurationSeconds: ptr.To[int32](15),
			AcquireTime: ptr.To(metav1.NewMicroTime(metav1.Now().Time)), RenewTime: ptr.To(metav1.NewMicroTime(metav1.Now().Time))},
	}
	renewed := base.DeepCopy()
	renewed.ResourceVersion = "2"
	renewed.Spec.RenewTime = ptr.To(metav1.NewMicroTime(base.Spec.RenewTime.Add(5e9)))
	g.Expect(renewalOnly(base, renewed)).To(BeTrue())

	for name, change := range map[string]func(*coordinationv1.Lease){
		"holder":   func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = ptr.To("") },
		"duration": func(l *coordinationv1.Lease) { l.Spec.LeaseDurationSeconds = ptr.To[int32](30) },
		"acquired": func(l *coordinationv1.Lease) { l.Spec.AcquireTime = ptr.To(metav1.NewMicroTime(l.Spec.RenewTime.Time)) },
		"weight":   func(l *coordinationv1.Lease) { l.Labels[v1alpha1.LabelVirtualNodes] = "10" },
		"ring":     func(l *coordinationv1.Lease) { l.Labels[v1alpha1.LabelRing] = "other" },
		"restarting": func(l *coordinationv1.Lease) {
			l.Annotations = map[string]string{v1alpha1.AnnotationRestarting: "true"}
		},
		"deletion":   func(l *coordinationv1.Lease) { l.DeletionTimestamp = ptr.To(metav1.Now()) },
		"re-created": func(l *coordinationv1.Lease) { l.UID = "v" },
		"watch lag":  func(l *coordinationv1.Lease) { l.Annotations = map[string]string{v1alpha1.AnnotationMaxWatchLag: "5s"} },
	} {
		changed := renewed.DeepCopy()
		change(changed)
		g.Expect(renewalOnly(base, changed)).To(BeFalse(), name)
	}
}
