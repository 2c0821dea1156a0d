package assign

import (
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/sharder/assign/internal/metacache"
)

func TestDrainTimes(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakePassiveClock(now)
	tr := newDrainTimes(clk)

	if start := tr.Begin("a"); !start.Equal(now) {
		t.Fatalf("Begin = %v, want %v", start, now)
	}
	clk.SetTime(now.Add(time.Second))
	if start := tr.Begin("a"); !start.Equal(now) {
		t.Errorf("second Begin moved the start to %v", start)
	}
	// A drain never seen starting gets a fresh timeout from now.
	if d := tr.Deadline("b", 10*time.Second); !d.Equal(now.Add(11 * time.Second)) {
		t.Errorf("Deadline(b) = %v, want %v", d, now.Add(11*time.Second))
	}
	if d := tr.Deadline("a", 10*time.Second); !d.Equal(now.Add(10 * time.Second)) {
		t.Errorf("Deadline(a) = %v, want %v", d, now.Add(10*time.Second))
	}
	if tr.Len() != 2 {
		t.Errorf("Len = %d, want 2", tr.Len())
	}
	clk.SetTime(now.Add(3 * time.Second))
	if dur, ok := tr.End("a"); !ok || dur != 3*time.Second {
		t.Errorf("End(a) = %v, %v; want 3s, true", dur, ok)
	}
	if _, ok := tr.End("a"); ok {
		t.Error("End(a) twice reported a drain")
	}
	if tr.Len() != 1 {
		t.Errorf("Len = %d, want 1", tr.Len())
	}
}

func TestReleaseTimes(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakePassiveClock(now)
	tr := newDrainTimes(clk)

	// The sharder's own release counts from when its write returned, with
	// the grace it chose then.
	tr.Release("a", 7*time.Second)
	clk.SetTime(now.Add(time.Second))
	if at, grace := tr.Released("a", time.Second); !at.Equal(now) || grace != 7*time.Second {
		t.Errorf("Released(a) = %v, %v; want %v, 7s", at, grace, now)
	}
	// A release this sharder did not write counts from its first sight.
	if at, grace := tr.Released("b", 3*time.Second); !at.Equal(now.Add(time.Second)) || grace != 3*time.Second {
		t.Errorf("Released(b) = %v, %v; want %v, 3s", at, grace, now.Add(time.Second))
	}
	clk.SetTime(now.Add(2 * time.Second))
	if at, _ := tr.Released("b", 3*time.Second); !at.Equal(now.Add(time.Second)) {
		t.Errorf("Released(b) moved to %v", at)
	}
	// The end of the drain forgets the release.
	tr.End("a")
	if at, _ := tr.Released("a", time.Second); !at.Equal(now.Add(2 * time.Second)) {
		t.Errorf("Released(a) after End = %v, want a fresh record at %v", at, now.Add(2*time.Second))
	}
}

func TestDrainStartedFromTheObject(t *testing.T) {
	const ring = "web"
	now := time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)
	timeout := 30 * time.Second
	draining := func(started string) *metacache.Object {
		o := &metacache.Object{UID: "u", Labels: map[string]string{v1alpha1.DrainLabel(ring): "b"}}
		if started != "" {
			o.Annotations = map[string]string{v1alpha1.DrainStartedAnnotation(ring): started}
		}
		return o
	}
	for _, tc := range []struct {
		name string
		obj  *metacache.Object
		want time.Time
	}{
		{"written 10 s ago", draining(v1alpha1.FormatDrainStarted(now.Add(-10 * time.Second))), now.Add(-10 * time.Second)},
		{"written by a clock ahead of this one: now", draining(v1alpha1.FormatDrainStarted(now.Add(time.Minute))), now},
		{"written longer ago than the timeout: one timeout ago", draining(v1alpha1.FormatDrainStarted(now.Add(-time.Hour))), now.Add(-timeout)},
		{"malformed: no start", draining("soon"), time.Time{}},
		{"none written: no start", draining(""), time.Time{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &ringAssigner{name: ring, drains: newDrainTimes(nil)}
			if got := r.drainStarted(tc.obj, now, timeout); !got.Equal(tc.want) {
				t.Errorf("drainStarted = %s, want %s", got, tc.want)
			}
		})
	}
	t.Run("the start this sharder recorded comes first", func(t *testing.T) {
		r := &ringAssigner{name: ring, drains: newDrainTimes(nil)}
		r.drains.BeginAt("u", now.Add(-time.Second))
		if got := r.drainStarted(draining(v1alpha1.FormatDrainStarted(now.Add(-20*time.Second))), now, timeout); !got.Equal(now.Add(-time.Second)) {
			t.Errorf("drainStarted = %s, want the recorded %s", got, now.Add(-time.Second))
		}
	})
}
