package metacache

import (
	"reflect"
	"testing"
	"time"
	"unsafe"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func TestTransformKeepsOnlyWhatAssignmentNeeds(t *testing.T) {
	r := NewObjectTransform("web")
	in := &metav1.PartialObjectMetadata{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{
			Name: "a", Namespace: "ns", UID: "u1", ResourceVersion: "7", Generation: 3,
			Labels: map[string]string{
				"shard.sharder.dev/web": "i1", "drain.sharder.dev/web": "true",
				"shard.sharder.dev/other": "x", "app": "db",
			},
			Annotations: map[string]string{"big": "value",
				"drain-started.sharder.dev/web": "2026-01-02T03:04:05.000Z", "drain-started.sharder.dev/other": "x"},
			ManagedFields:     []metav1.ManagedFieldsEntry{{Manager: "kubectl"}},
			Finalizers:        []string{"f"},
			DeletionTimestamp: &metav1.Time{Time: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)},
			OwnerReferences: []metav1.OwnerReference{
				{APIVersion: "v1", Kind: "Secret", Name: "other", UID: "u2"},
				{APIVersion: "apps/v1", Kind: "Deployment", Name: "d", UID: "u3", Controller: ptr.To(true)},
			},
		},
	}
	out, err := r.Transform(in)
	if err != nil {
		t.Fatal(err)
	}
	got, ok := out.(*Object)
	if !ok {
		t.Fatalf("transform returned %T, want *Object", out)
	}
	if got.Name != "a" || got.Namespace != "ns" || got.UID != "u1" || got.ResourceVersion != "7" {
		t.Errorf("identity lost: %+v", got)
	}
	if len(got.Labels) != 2 || got.Labels["shard.sharder.dev/web"] != "i1" || got.Labels["drain.sharder.dev/web"] != "true" {
		t.Errorf("labels = %v, want only the ring's two", got.Labels)
	}
	if got.GetDeletionTimestamp() == nil || !got.GetDeletionTimestamp().Equal(in.DeletionTimestamp) {
		t.Errorf("deletionTimestamp = %v, want %v", got.GetDeletionTimestamp(), in.DeletionTimestamp)
	}
	if len(got.OwnerReferences) != 1 || got.OwnerReferences[0].UID != "u3" {
		t.Errorf("ownerReferences = %v, want only the controller", got.OwnerReferences)
	}
	if len(got.Annotations) != 1 || got.Annotations["drain-started.sharder.dev/web"] != "2026-01-02T03:04:05.000Z" {
		t.Errorf("annotations = %v, want only the ring's drain start", got.Annotations)
	}
	// A drain start left behind by a drain that ended is not kept.
	ended := in.DeepCopy()
	delete(ended.Labels, "drain.sharder.dev/web")
	if out, _ := r.Transform(ended); out.(*Object).Annotations != nil {
		t.Errorf("annotations of an object that is not draining = %v, want none", out.(*Object).Annotations)
	}
	again, _ := r.Transform(got)
	if again != got {
		t.Error("transform is not idempotent")
	}
	// Anything else passes through untouched.
	if v, _ := r.Transform("tombstone"); v != "tombstone" {
		t.Errorf("non-metadata object changed: %v", v)
	}
}

func TestTransformSharesLabelSets(t *testing.T) {
	r := NewObjectTransform("web")
	obj := func(name string, labels map[string]string) *Object {
		in := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: string([]byte("ns")), Labels: labels,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: string([]byte("apps/v1")), Kind: string([]byte("Deployment")), Name: "d", UID: "u", Controller: ptr.To(true)}},
		}}
		out, err := r.Transform(in)
		if err != nil {
			t.Fatal(err)
		}
		return out.(*Object)
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
