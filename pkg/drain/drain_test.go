package drain

import (
	"encoding/json"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
