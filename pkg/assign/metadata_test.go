package assign

import (
	"reflect"
	"testing"
	"time"
	"unsafe"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
)

func TestTransformKeepsOnlyWhatAssignmentNeeds(t *testing.T) {
	r := &runner{shardLabel: v1alpha1.ShardLabel("web"), drainLabel: v1alpha1.DrainLabel("web")}
	in := &metav1.PartialObjectMetadata{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{
			Name: "a", Namespace: "ns", UID: "u1", ResourceVersion: "7", Generation: 3,
			Labels: map[string]string{
				"shard.sharder.dev/web": "i1", "drain.sharder.dev/web": "true",
				"shard.sharder.dev/other": "x", "app": "db",
			},
			Annotations:   map[string]string{"big": "value"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}},
			Finalizers:    []string{"f"},
			OwnerReferences: []metav1.OwnerReference{
				{APIVersion: "v1", Kind: "Secret", Name: "other", UID: "u2"},
				{APIVersion: "apps/v1", Kind: "Deployment", Name: "d", UID: "u3", Controller: ptr.To(true)},
			},
		},
	}
	out, err := r.transformObject(in)
	if err != nil {
		t.Fatal(err)
	}
	got, ok := out.(*object)
	if !ok {
		t.Fatalf("transform returned %T, want *object", out)
	}
	if got.Name != "a" || got.Namespace != "ns" || got.UID != "u1" || got.ResourceVersion != "7" {
		t.Errorf("identity lost: %+v", got)
	}
	if len(got.Labels) != 2 || got.Labels["shard.sharder.dev/web"] != "i1" || got.Labels["drain.sharder.dev/web"] != "true" {
		t.Errorf("labels = %v, want only the ring's two", got.Labels)
	}
	if len(got.OwnerReferences) != 1 || got.OwnerReferences[0].UID != "u3" {
		t.Errorf("ownerReferences = %v, want only the controller", got.OwnerReferences)
	}
	again, _ := r.transformObject(got)
	if again != got {
		t.Error("transform is not idempotent")
	}
	// Anything else passes through untouched.
	if v, _ := r.transformObject("tombstone"); v != "tombstone" {
		t.Errorf("non-metadata object changed: %v", v)
	}
}

func TestDescribeMembershipChange(t *testing.T) {
	ready := func(id string) membership.Member { return membership.Member{ID: id, State: membership.StateReady} }
	for _, tc := range []struct {
		name      string
		prev, cur []membership.Member
		want      string
	}{
		{"none", []membership.Member{ready("a")}, []membership.Member{ready("a")}, ""},
		{"join", []membership.Member{ready("a")}, []membership.Member{ready("a"), ready("b")}, "b joined (ready); 2 of 2 instances ready"},
		{"leave", []membership.Member{ready("a"), ready("b")}, []membership.Member{ready("a")}, "b left; 1 of 1 instances ready"},
		{"state", []membership.Member{ready("a"), ready("b")}, []membership.Member{ready("a"), {ID: "b", State: membership.StateDead}}, "b ready -> dead; 1 of 2 instances ready"},
		{"weight", []membership.Member{ready("a")}, []membership.Member{{ID: "a", State: membership.StateReady, VirtualNodes: 5}}, "a virtual nodes 0 -> 5; 1 of 1 instances ready"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := describeMembershipChange(tc.prev, tc.cur); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestBuildViewReusesRingWhenReadySetUnchanged(t *testing.T) {
	cfg := &ringConfig{name: "r", algorithm: v1alpha1.AlgorithmConsistentHash, virtualNodes: 16}
	rings := &membership.Rings{}
	m := []membership.Member{{ID: "a", State: membership.StateReady}, {ID: "b", State: membership.StateExpired}}
	_, built, err := buildView(rings, cfg, m, time.Time{})
	if err != nil || !built {
		t.Fatalf("first build: %v, built=%v", err, built)
	}
	// b goes from expired to uncertain: the ready set is the same.
	m2 := []membership.Member{{ID: "a", State: membership.StateReady}, {ID: "b", State: membership.StateUncertain}}
	v2, built, err := buildView(rings, cfg, m2, time.Time{})
	if err != nil || built {
		t.Fatalf("second build: %v, built=%v; want the ring reused", err, built)
	}
	if v2.states["b"] != membership.StateUncertain {
		t.Errorf("state of b = %s, want uncertain", v2.states["b"])
	}
	if id, err := v2.ring.Lookup("k"); err != nil || id != "a" {
		t.Errorf("Lookup = %q, %v; want a (the only ready instance)", id, err)
	}
	m3 := []membership.Member{{ID: "a", State: membership.StateReady}, {ID: "b", State: membership.StateReady}}
	if _, built, _ := buildView(rings, cfg, m3, time.Time{}); !built {
		t.Error("ring not rebuilt when b became ready")
	}
}

func TestTransformSharesLabelSets(t *testing.T) {
	r := &runner{shardLabel: v1alpha1.ShardLabel("web"), drainLabel: v1alpha1.DrainLabel("web")}
	obj := func(name string, labels map[string]string) *object {
		in := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: string([]byte("ns")), Labels: labels,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: string([]byte("apps/v1")), Kind: string([]byte("Deployment")), Name: "d", UID: "u", Controller: ptr.To(true)}},
		}}
		out, err := r.transformObject(in)
		if err != nil {
			t.Fatal(err)
		}
		return out.(*object)
	}
	a := obj("a", map[string]string{"shard.sharder.dev/web": "i1", "app": "x"})
	b := obj("b", map[string]string{"shard.sharder.dev/web": "i1", "app": "y"})
	c := obj("c", map[string]string{"shard.sharder.dev/web": "i2"})
	d := obj("d", map[string]string{"shard.sharder.dev/web": "i1", "drain.sharder.dev/web": "true"})
	e := obj("e", map[string]string{"app": "z"})
	same := func(x, y map[string]string) bool {
		return reflect.ValueOf(x).UnsafePointer() == reflect.ValueOf(y).UnsafePointer()
	}
	if !same(a.Labels, b.Labels) {
		t.Error("equal ring labels are not shared")
	}
	if same(a.Labels, c.Labels) || same(a.Labels, d.Labels) {
		t.Error("different ring labels share a map")
	}
	if c.Labels["shard.sharder.dev/web"] != "i2" || len(c.Labels) != 1 || len(d.Labels) != 2 || d.Labels["drain.sharder.dev/web"] != "true" {
		t.Errorf("labels wrong: c=%v d=%v", c.Labels, d.Labels)
	}
	if e.Labels != nil {
		t.Errorf("labels of an object without ring labels = %v, want nil", e.Labels)
	}
	if unsafe.StringData(a.Namespace) != unsafe.StringData(b.Namespace) ||
		unsafe.StringData(a.OwnerReferences[0].Kind) != unsafe.StringData(b.OwnerReferences[0].Kind) ||
		unsafe.StringData(a.OwnerReferences[0].APIVersion) != unsafe.StringData(b.OwnerReferences[0].APIVersion) {
		t.Error("namespace or ownerReference apiVersion and kind not shared")
	}
	if a.OwnerReferences[0].Kind != "Deployment" || a.OwnerReferences[0].APIVersion != "apps/v1" || a.Namespace != "ns" {
		t.Errorf("shared values changed: %+v", a)
	}
}
