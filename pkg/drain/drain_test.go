package drain

import (
	"encoding/json"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
)

func TestRequestPatch(t *testing.T) {
	for _, tc := range []struct {
		target, want string
	}{
		{"b", "b"},
		{"pod-7.example", "pod-7.example"},
		{"", NoTarget},
		{NoTarget, NoTarget},
		{"Not_An_ID", NoTarget},
	} {
		var got struct {
			Metadata struct {
				ResourceVersion string            `json:"resourceVersion"`
				Labels          map[string]string `json:"labels"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal(RequestPatch("web", "42", tc.target), &got); err != nil {
			t.Fatal(err)
		}
		if got.Metadata.ResourceVersion != "42" {
			t.Errorf("resourceVersion = %q, want 42", got.Metadata.ResourceVersion)
		}
		if len(got.Metadata.Labels) != 1 || got.Metadata.Labels["drain.sharder.dev/web"] != tc.want {
			t.Errorf("target %q: labels = %v, want only drain.sharder.dev/web=%s", tc.target, got.Metadata.Labels, tc.want)
		}
	}
}

func TestTarget(t *testing.T) {
	for _, tc := range []struct {
		labels map[string]string
		want   string
	}{
		{nil, ""},
		{map[string]string{"shard.sharder.dev/web": "a"}, ""},
		{map[string]string{"shard.sharder.dev/web": "a", "drain.sharder.dev/web": "b"}, "b"},
		{map[string]string{"shard.sharder.dev/web": "a", "drain.sharder.dev/other": "b"}, ""},
		{map[string]string{"shard.sharder.dev/web": "a", "drain.sharder.dev/web": NoTarget}, ""},
		{map[string]string{"shard.sharder.dev/web": "a", "drain.sharder.dev/web": ""}, ""},
		{map[string]string{"shard.sharder.dev/web": "a", "drain.sharder.dev/web": "B"}, ""},
		{map[string]string{"shard.sharder.dev/web": "a", "drain.sharder.dev/web": "a"}, ""},
		{map[string]string{"drain.sharder.dev/web": "b"}, ""},
	} {
		obj := &metav1.ObjectMeta{Labels: tc.labels}
		got, ok := Target(obj, "web")
		if got != tc.want || ok != (tc.want != "") {
			t.Errorf("Target(%v) = %q, %v; want %q", tc.labels, got, ok, tc.want)
		}
	}
}

func TestRequested(t *testing.T) {
	for _, tc := range []struct {
		labels map[string]string
		want   bool
	}{
		{nil, false},
		{map[string]string{"shard.sharder.dev/web": "a"}, false},
		{map[string]string{"drain.sharder.dev/other": "true"}, false},
		{map[string]string{"drain.sharder.dev/web": "true"}, true},
		{map[string]string{"drain.sharder.dev/web": ""}, true},
	} {
		obj := &metav1.ObjectMeta{Labels: tc.labels}
		if got := Requested(obj, "web"); got != tc.want {
			t.Errorf("Requested(%v) = %v, want %v", tc.labels, got, tc.want)
		}
	}
}

func TestTracker(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakePassiveClock(now)
	tr := NewTracker(clk)

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
