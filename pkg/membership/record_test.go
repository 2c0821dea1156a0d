package membership

import (
	"math"
	"reflect"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// recordLease returns the Lease of instance "i" held by holder, acquired at
// acquired (none when zero), renewed at epoch, with a duration of 10 s and
// transitions changes of holder (none written when negative).
func recordLease(holder string, acquired time.Time, transitions int32) *coordinationv1.Lease {
	l := instanceLease("i", holder, epoch, 10)
	if !acquired.IsZero() {
		l.Spec.AcquireTime = ptr.To(metav1.NewMicroTime(acquired))
	}
	if transitions >= 0 {
		l.Spec.LeaseTransitions = ptr.To(transitions)
	}
	return l
}

// withAnnotations returns l with the annotations kv (key, value, ...).
func withAnnotations(l *coordinationv1.Lease, kv ...string) *coordinationv1.Lease {
	l.Annotations = map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		l.Annotations[kv[i]] = kv[i+1]
	}
	return l
}

// podRef is an owner reference to the Pod name.
func podRef(name string) metav1.OwnerReference {
	return metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: name, UID: types.UID("uid-" + name)}
}

// wantRecord is what a test expects of a written record; a nil pointer
// expects the field absent.
type wantRecord struct {
	holder      string
	seconds     *int32
	acquire     *time.Time
	transitions *int32
}

// checkRecord compares the spec of got with want; the renewal is always now.
func checkRecord(t *testing.T, got *coordinationv1.Lease, want wantRecord, now time.Time) {
	t.Helper()
	s := got.Spec
	if h := ptr.Deref(s.HolderIdentity, "<nil>"); h != want.holder {
		t.Errorf("holder = %q, want %q", h, want.holder)
	}
	if s.RenewTime == nil || !s.RenewTime.Time.Equal(now) {
		t.Errorf("renewTime = %v, want %v", s.RenewTime, now)
	}
	if !reflect.DeepEqual(s.LeaseDurationSeconds, want.seconds) {
		t.Errorf("leaseDurationSeconds = %v, want %v", ptr.Deref(s.LeaseDurationSeconds, -1), ptr.Deref(want.seconds, -1))
	}
	switch {
	case want.acquire == nil && s.AcquireTime != nil:
		t.Errorf("acquireTime = %v, want none", s.AcquireTime)
	case want.acquire != nil && (s.AcquireTime == nil || !s.AcquireTime.Time.Equal(*want.acquire)):
		t.Errorf("acquireTime = %v, want %v", s.AcquireTime, *want.acquire)
	}
	if !reflect.DeepEqual(s.LeaseTransitions, want.transitions) {
		t.Errorf("leaseTransitions = %v, want %v", ptr.Deref(s.LeaseTransitions, -1), ptr.Deref(want.transitions, -1))
	}
}

// TestRecordWrites checks every write of an instance Lease: who holds it
// after, its duration, when it was acquired, and how its transitions count.
// Each write leaves the Lease it was given as it was.
func TestRecordWrites(t *testing.T) {
	now := epoch.Add(time.Minute)
	before := epoch.Add(-time.Minute)
	h := Holding{Identity: "i", Namespace: "ns", Ring: "r", Duration: 15 * time.Second}
	cases := []struct {
		name  string
		lease *coordinationv1.Lease
		write func(*coordinationv1.Lease) *coordinationv1.Lease
		want  wantRecord
	}{{
		name:  "the instance creates its Lease",
		lease: &coordinationv1.Lease{},
		write: func(l *coordinationv1.Lease) *coordinationv1.Lease { return h.Acquire(l, now) },
		want:  wantRecord{holder: "i", seconds: ptr.To[int32](15), acquire: &now},
	}, {
		name:  "the instance renews: acquireTime and transitions stay",
		lease: recordLease("i", before, 3),
		write: func(l *coordinationv1.Lease) *coordinationv1.Lease { return h.Renew(l, now) },
		want:  wantRecord{holder: "i", seconds: ptr.To[int32](15), acquire: &before, transitions: ptr.To[int32](3)},
	}, {
		name:  "a renewal of a Lease without acquireTime acquires it",
		lease: recordLease("i", time.Time{}, -1),
		write: func(l *coordinationv1.Lease) *coordinationv1.Lease { return h.Renew(l, now) },
		want:  wantRecord{holder: "i", seconds: ptr.To[int32](15), acquire: &now},
	}, {
		name:  "the instance acquires a released Lease: no change of holder counted",
		lease: recordLease("", before, 2),
		write: func(l *coordinationv1.Lease) *coordinationv1.Lease { return h.Acquire(l, now) },
		want:  wantRecord{holder: "i", seconds: ptr.To[int32](15), acquire: &now, transitions: ptr.To[int32](2)},
	}, {
		name:  "the instance acquires its own Lease again: no change of holder",
		lease: recordLease("i", before, 2),
		write: func(l *coordinationv1.Lease) *coordinationv1.Lease { return h.Acquire(l, now) },
		want:  wantRecord{holder: "i", seconds: ptr.To[int32](15), acquire: &now, transitions: ptr.To[int32](2)},
	}, {
		name:  "the instance acquires its Lease from the sharder: one transition",
		lease: recordLease("sharder:s", before, 2),
		write: func(l *coordinationv1.Lease) *coordinationv1.Lease { return h.Acquire(l, now) },
		want:  wantRecord{holder: "i", seconds: ptr.To[int32](15), acquire: &now, transitions: ptr.To[int32](3)},
	}, {
		name:  "transitions stop at the largest int32",
		lease: recordLease("sharder:s", before, math.MaxInt32),
		write: func(l *coordinationv1.Lease) *coordinationv1.Lease { return h.Acquire(l, now) },
		want:  wantRecord{holder: "i", seconds: ptr.To[int32](15), acquire: &now, transitions: ptr.To[int32](math.MaxInt32)},
	}, {
		name:  "the instance releases: holder empty, the rest kept",
		lease: recordLease("i", before, -1),
		write: func(l *coordinationv1.Lease) *coordinationv1.Lease { return h.Release(l, now, false) },
		want:  wantRecord{holder: "", seconds: ptr.To[int32](10), acquire: &before},
	}, {
		name:  "the sharder takes an uncertain Lease: twice its duration, one transition",
		lease: recordLease("i", before, 4),
		write: func(l *coordinationv1.Lease) *coordinationv1.Lease { return Take(l, "sharder:s", now) },
		want:  wantRecord{holder: "sharder:s", seconds: ptr.To[int32](20), acquire: &now, transitions: ptr.To[int32](5)},
	}, {
		name: "a takeover of a Lease without duration doubles the default",
		lease: func() *coordinationv1.Lease {
			l := recordLease("i", before, -1)
			l.Spec.LeaseDurationSeconds = nil
			return l
		}(),
		write: func(l *coordinationv1.Lease) *coordinationv1.Lease { return Take(l, "sharder:s", now) },
		want:  wantRecord{holder: "sharder:s", seconds: ptr.To[int32](30), acquire: &now, transitions: ptr.To[int32](1)},
	}, {
		name:  "the sharder fences: a takeover",
		lease: recordLease("i", before, 4),
		write: func(l *coordinationv1.Lease) *coordinationv1.Lease { return Fence(l, "sharder:s", now) },
		want:  wantRecord{holder: "sharder:s", seconds: ptr.To[int32](20), acquire: &now, transitions: ptr.To[int32](5)},
	}, {
		name:  "the sharder holds a released Lease: its duration, one transition",
		lease: recordLease("", before, 1),
		write: func(l *coordinationv1.Lease) *coordinationv1.Lease { return Hold(l, "sharder:s", now) },
		want:  wantRecord{holder: "sharder:s", seconds: ptr.To[int32](10), acquire: &now, transitions: ptr.To[int32](2)},
	}, {
		name:  "the sharder renews its hold: acquireTime and transitions stay",
		lease: recordLease("sharder:s", before, 2),
		write: func(l *coordinationv1.Lease) *coordinationv1.Lease { return Hold(l, "sharder:s", now) },
		want:  wantRecord{holder: "sharder:s", seconds: ptr.To[int32](10), acquire: &before, transitions: ptr.To[int32](2)},
	}, {
		name:  "a new sharder leader holds the previous leader's hold: one transition",
		lease: recordLease("sharder:old", before, 2),
		write: func(l *coordinationv1.Lease) *coordinationv1.Lease { return Hold(l, "sharder:s", now) },
		want:  wantRecord{holder: "sharder:s", seconds: ptr.To[int32](10), acquire: &now, transitions: ptr.To[int32](3)},
	}, {
		name:  "the sharder releases its hold: an absent count stays absent",
		lease: recordLease("sharder:s", before, -1),
		write: func(l *coordinationv1.Lease) *coordinationv1.Lease { return Release(l, now) },
		want:  wantRecord{holder: "", seconds: ptr.To[int32](10), acquire: &before},
	}, {
		name:  "the sharder takes a Lease back into its ring: its own spec",
		lease: recordLease("i", before, 6),
		write: func(l *coordinationv1.Lease) *coordinationv1.Lease {
			return HoldInRing(l, "r", "sharder:s", 7*time.Second, now)
		},
		want: wantRecord{holder: "sharder:s", seconds: ptr.To[int32](7), acquire: &now, transitions: ptr.To[int32](7)},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			original := tc.lease.DeepCopy()
			got := tc.write(tc.lease)
			checkRecord(t, got, tc.want, now)
			if !reflect.DeepEqual(tc.lease, original) {
				t.Errorf("the write changed the Lease it was given")
			}
			if got == tc.lease {
				t.Errorf("the write returned the Lease it was given, not a copy")
			}
		})
	}
}

// TestRecordMetadata checks the labels, annotations and owner references
// each write puts on a Lease or takes off it.
func TestRecordMetadata(t *testing.T) {
	now := epoch.Add(time.Minute)
	pod := podRef("i")
	h := Holding{
		Identity: "i", Namespace: "ns", Ring: "r", Duration: 15 * time.Second,
		VirtualNodes: 3, MaxWatchLag: 10 * time.Second, MaxStop: 5 * time.Second, Pod: &pod,
		Annotations: map[string]string{v1alpha1.AnnotationSlotsAcknowledged: "uid/4"},
	}
	bare := Holding{Identity: "i", Namespace: "ns", Ring: "r", Duration: 15 * time.Second}
	marked := func() *coordinationv1.Lease {
		l := withAnnotations(recordLease("", epoch, 1),
			v1alpha1.AnnotationRestarting, "true", v1alpha1.AnnotationFenced, "true",
			v1alpha1.AnnotationMaxWatchLag, "1s", v1alpha1.AnnotationMaxStop, "1s", "other", "kept")
		l.Labels[v1alpha1.LabelVirtualNodes] = "9"
		l.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "s"}, podRef("old")}
		return l
	}
	cases := []struct {
		name        string
		write       func(*coordinationv1.Lease) *coordinationv1.Lease
		labels      map[string]string
		annotations map[string]string
		owners      []metav1.OwnerReference
	}{{
		name:   "acquire drops restarting and fenced, writes the promises and puts the Pod first",
		write:  func(l *coordinationv1.Lease) *coordinationv1.Lease { return h.Acquire(l, now) },
		labels: map[string]string{v1alpha1.LabelRing: "r", v1alpha1.LabelVirtualNodes: "3"},
		annotations: map[string]string{
			v1alpha1.AnnotationMaxWatchLag: "10s", v1alpha1.AnnotationMaxStop: "5s",
			v1alpha1.AnnotationSlotsAcknowledged: "uid/4", "other": "kept",
		},
		owners: []metav1.OwnerReference{pod, {APIVersion: "apps/v1", Kind: "StatefulSet", Name: "s"}},
	}, {
		name:        "a renewal without promises removes them, and keeps the owners without a Pod",
		write:       func(l *coordinationv1.Lease) *coordinationv1.Lease { return bare.Renew(l, now) },
		labels:      map[string]string{v1alpha1.LabelRing: "r"},
		annotations: map[string]string{"other": "kept"},
		owners:      []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "s"}, podRef("old")},
	}, {
		name:   "a release for good keeps everything",
		write:  func(l *coordinationv1.Lease) *coordinationv1.Lease { return h.Release(l, now, false) },
		labels: map[string]string{v1alpha1.LabelRing: "r", v1alpha1.LabelVirtualNodes: "9"},
		annotations: map[string]string{
			v1alpha1.AnnotationRestarting: "true", v1alpha1.AnnotationFenced: "true",
			v1alpha1.AnnotationMaxWatchLag: "1s", v1alpha1.AnnotationMaxStop: "1s", "other": "kept",
		},
		owners: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "s"}, podRef("old")},
	}, {
		name:   "a release for a restart marks it restarting and drops the Pod owner",
		write:  func(l *coordinationv1.Lease) *coordinationv1.Lease { return h.Release(l, now, true) },
		labels: map[string]string{v1alpha1.LabelRing: "r", v1alpha1.LabelVirtualNodes: "9"},
		annotations: map[string]string{
			v1alpha1.AnnotationRestarting: "true", v1alpha1.AnnotationFenced: "true",
			v1alpha1.AnnotationMaxWatchLag: "1s", v1alpha1.AnnotationMaxStop: "1s", "other": "kept",
		},
		owners: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "s"}},
	}, {
		name:   "a release for a restart of a holder without a Pod keeps the owners",
		write:  func(l *coordinationv1.Lease) *coordinationv1.Lease { return bare.Release(l, now, true) },
		labels: map[string]string{v1alpha1.LabelRing: "r", v1alpha1.LabelVirtualNodes: "9"},
		annotations: map[string]string{
			v1alpha1.AnnotationRestarting: "true", v1alpha1.AnnotationFenced: "true",
			v1alpha1.AnnotationMaxWatchLag: "1s", v1alpha1.AnnotationMaxStop: "1s", "other": "kept",
		},
		owners: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "s"}, podRef("old")},
	}, {
		name:   "the sharder's hold drops restarting only",
		write:  func(l *coordinationv1.Lease) *coordinationv1.Lease { return Hold(l, "sharder:s", now) },
		labels: map[string]string{v1alpha1.LabelRing: "r", v1alpha1.LabelVirtualNodes: "9"},
		annotations: map[string]string{
			v1alpha1.AnnotationFenced:      "true",
			v1alpha1.AnnotationMaxWatchLag: "1s", v1alpha1.AnnotationMaxStop: "1s", "other": "kept",
		},
		owners: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "s"}, podRef("old")},
	}, {
		name:   "the fence adds the fenced annotation and keeps the rest",
		write:  func(l *coordinationv1.Lease) *coordinationv1.Lease { return Fence(l, "sharder:s", now) },
		labels: map[string]string{v1alpha1.LabelRing: "r", v1alpha1.LabelVirtualNodes: "9"},
		annotations: map[string]string{
			v1alpha1.AnnotationRestarting: "true", v1alpha1.AnnotationFenced: "true",
			v1alpha1.AnnotationMaxWatchLag: "1s", v1alpha1.AnnotationMaxStop: "1s", "other": "kept",
		},
		owners: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "s"}, podRef("old")},
	}, {
		name: "taken back into the ring: the ring label again, restarting dropped",
		write: func(l *coordinationv1.Lease) *coordinationv1.Lease {
			unlabelled := l.DeepCopy()
			delete(unlabelled.Labels, v1alpha1.LabelRing)
			return HoldInRing(unlabelled, "r", "sharder:s", 10*time.Second, now)
		},
		labels: map[string]string{v1alpha1.LabelRing: "r", v1alpha1.LabelVirtualNodes: "9"},
		annotations: map[string]string{
			v1alpha1.AnnotationFenced:      "true",
			v1alpha1.AnnotationMaxWatchLag: "1s", v1alpha1.AnnotationMaxStop: "1s", "other": "kept",
		},
		owners: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "s"}, podRef("old")},
	}, {
		name:   "the state label",
		write:  func(l *coordinationv1.Lease) *coordinationv1.Lease { return WithState(l, StateDead) },
		labels: map[string]string{v1alpha1.LabelRing: "r", v1alpha1.LabelVirtualNodes: "9", v1alpha1.LabelState: "dead"},
		annotations: map[string]string{
			v1alpha1.AnnotationRestarting: "true", v1alpha1.AnnotationFenced: "true",
			v1alpha1.AnnotationMaxWatchLag: "1s", v1alpha1.AnnotationMaxStop: "1s", "other": "kept",
		},
		owners: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "s"}, podRef("old")},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			lease := marked()
			original := lease.DeepCopy()
			got := tc.write(lease)
			if !reflect.DeepEqual(got.Labels, tc.labels) {
				t.Errorf("labels = %v, want %v", got.Labels, tc.labels)
			}
			if !reflect.DeepEqual(got.Annotations, tc.annotations) {
				t.Errorf("annotations = %v, want %v", got.Annotations, tc.annotations)
			}
			if !reflect.DeepEqual(got.OwnerReferences, tc.owners) {
				t.Errorf("owners = %v, want %v", got.OwnerReferences, tc.owners)
			}
			if !reflect.DeepEqual(lease, original) {
				t.Errorf("the write changed the Lease it was given")
			}
		})
	}
}

// TestNewHeld checks the Lease the sharder creates for an instance whose
// Lease is absent.
func TestNewHeld(t *testing.T) {
	now := epoch
	got := NewHeld("ns", "i", "r", "sharder:s", 7*time.Second, now)
	if got.Namespace != "ns" || got.Name != "i" || !reflect.DeepEqual(got.Labels, map[string]string{v1alpha1.LabelRing: "r"}) {
		t.Errorf("metadata = %+v", got.ObjectMeta)
	}
	checkRecord(t, got, wantRecord{holder: "sharder:s", seconds: ptr.To[int32](7), acquire: &now, transitions: ptr.To[int32](1)}, now)
}

// TestFenced checks when a Lease shows a fence in force.
func TestFenced(t *testing.T) {
	cases := []struct {
		name  string
		lease *coordinationv1.Lease
		want  bool
	}{
		{"taken with the annotation", withAnnotations(recordLease("sharder:s", epoch, 1), v1alpha1.AnnotationFenced, "true"), true},
		{"released with the annotation", withAnnotations(recordLease("", epoch, 1), v1alpha1.AnnotationFenced, "true"), true},
		{"held by the instance", withAnnotations(recordLease("i", epoch, 1), v1alpha1.AnnotationFenced, "true"), false},
		{"taken without the annotation", recordLease("sharder:s", epoch, 1), false},
		{"another value", withAnnotations(recordLease("sharder:s", epoch, 1), v1alpha1.AnnotationFenced, "yes"), false},
	}
	for _, tc := range cases {
		if got := Fenced(tc.lease); got != tc.want {
			t.Errorf("%s: Fenced = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestRecordOf checks the record read from a Lease, absent fields as zero
// values, and that writing it back unchanged changes nothing.
func TestRecordOf(t *testing.T) {
	before := epoch.Add(-time.Minute)
	lease := recordLease("i", before, 3)
	want := Record{Holder: "i", DurationSeconds: 10, AcquireTime: before, RenewTime: epoch, Transitions: 3}
	if got := RecordOf(lease); !reflect.DeepEqual(got, want) {
		t.Errorf("RecordOf = %+v, want %+v", got, want)
	}
	if got := RecordOf(&coordinationv1.Lease{}); !reflect.DeepEqual(got, Record{}) {
		t.Errorf("RecordOf(empty) = %+v, want the zero record", got)
	}
	spec := lease.Spec.DeepCopy()
	RecordOf(lease).writeTo(spec)
	if !reflect.DeepEqual(*spec, lease.Spec) {
		t.Errorf("writing the record back changed the spec: %+v, was %+v", *spec, lease.Spec)
	}
}
