package drain_test

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/drain"
)

func TestRequestPatchStarted(t *testing.T) {
	g := NewWithT(t)
	started := time.Date(2026, 3, 4, 5, 6, 7, 891_234_567, time.FixedZone("x", 3600))
	patch := drain.RequestPatchStarted("web", "7", "b", started)
	g.Expect(string(patch)).To(MatchJSON(`{"metadata":{"resourceVersion":"7",` +
		`"annotations":{"drain-started.sharder.dev/web":"2026-03-04T04:06:07.891Z"},` +
		`"labels":{"drain.sharder.dev/web":"b"}}}`))
	g.Expect(string(drain.RequestPatchStarted("web", "", "Not_An_ID", started))).To(ContainSubstring(`"drain.sharder.dev/web":"true"`))
}

func TestStarted(t *testing.T) {
	started := time.Date(2026, 3, 4, 4, 6, 7, 891_000_000, time.UTC)
	for _, tc := range []struct {
		name        string
		labels      map[string]string
		annotations map[string]string
		want        time.Time
		ok          bool
	}{{
		name:        "drain with its start",
		labels:      map[string]string{v1alpha1.DrainLabel("web"): "b"},
		annotations: map[string]string{v1alpha1.DrainStartedAnnotation("web"): "2026-03-04T04:06:07.891Z"},
		want:        started, ok: true,
	}, {
		name:        "start of a drain that ended: not draining",
		annotations: map[string]string{v1alpha1.DrainStartedAnnotation("web"): "2026-03-04T04:06:07.891Z"},
	}, {
		name:   "drain without a start",
		labels: map[string]string{v1alpha1.DrainLabel("web"): "b"},
	}, {
		name:        "malformed start",
		labels:      map[string]string{v1alpha1.DrainLabel("web"): "b"},
		annotations: map[string]string{v1alpha1.DrainStartedAnnotation("web"): "yesterday"},
	}, {
		name:        "another ring's start",
		labels:      map[string]string{v1alpha1.DrainLabel("web"): "b"},
		annotations: map[string]string{v1alpha1.DrainStartedAnnotation("other"): "2026-03-04T04:06:07.891Z"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			got, ok := drain.Started(&metav1.ObjectMeta{Labels: tc.labels, Annotations: tc.annotations}, "web")
			g.Expect(ok).To(Equal(tc.ok))
			g.Expect(got.Equal(tc.want)).To(BeTrue(), "got %s", got)
		})
	}
}
