package drain_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/internal/testenv"
	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/drain"
)

const ring = "web"

func TestAcknowledgePatch(t *testing.T) {
	for _, tc := range []struct {
		name    string
		labels  map[string]string
		rv      string
		want    string
		wantErr error
	}{{
		name:   "drain naming the target: hand-over",
		labels: map[string]string{v1alpha1.ShardLabel(ring): "a", v1alpha1.DrainLabel(ring): "b", "app": "x"},
		rv:     "42",
		want:   `{"metadata":{"annotations":{"drain-started.sharder.dev/web":null},"labels":{"drain.sharder.dev/web":null,"shard.sharder.dev/web":"b"},"resourceVersion":"42"}}`,
	}, {
		name:   "drain naming no target",
		labels: map[string]string{v1alpha1.ShardLabel(ring): "a", v1alpha1.DrainLabel(ring): drain.NoTarget, "app": "x"},
		rv:     "42",
		want:   `{"metadata":{"annotations":{"drain-started.sharder.dev/web":null},"labels":{"drain.sharder.dev/web":null,"shard.sharder.dev/web":null},"resourceVersion":"42"}}`,
	}, {
		name:   "drain value that is not an instance ID",
		labels: map[string]string{v1alpha1.ShardLabel(ring): "a", v1alpha1.DrainLabel(ring): "Not_An_ID"},
		rv:     "42",
		want:   `{"metadata":{"annotations":{"drain-started.sharder.dev/web":null},"labels":{"drain.sharder.dev/web":null,"shard.sharder.dev/web":null},"resourceVersion":"42"}}`,
	}, {
		name:   "empty drain value",
		labels: map[string]string{v1alpha1.ShardLabel(ring): "a", v1alpha1.DrainLabel(ring): ""},
		rv:     "42",
		want:   `{"metadata":{"annotations":{"drain-started.sharder.dev/web":null},"labels":{"drain.sharder.dev/web":null,"shard.sharder.dev/web":null},"resourceVersion":"42"}}`,
	}, {
		name:   "drain naming the current instance",
		labels: map[string]string{v1alpha1.ShardLabel(ring): "a", v1alpha1.DrainLabel(ring): "a"},
		rv:     "42",
		want:   `{"metadata":{"annotations":{"drain-started.sharder.dev/web":null},"labels":{"drain.sharder.dev/web":null,"shard.sharder.dev/web":null},"resourceVersion":"42"}}`,
	}, {
		name:   "released object: no instance to hand over from",
		labels: map[string]string{v1alpha1.DrainLabel(ring): "b"},
		rv:     "42",
		want:   `{"metadata":{"annotations":{"drain-started.sharder.dev/web":null},"labels":{"drain.sharder.dev/web":null,"shard.sharder.dev/web":null},"resourceVersion":"42"}}`,
	}, {
		name:    "not draining",
		labels:  map[string]string{v1alpha1.ShardLabel(ring): "a"},
		rv:      "42",
		wantErr: drain.ErrNotDraining,
	}, {
		name:    "drain label of another ring",
		labels:  map[string]string{v1alpha1.ShardLabel(ring): "a", v1alpha1.DrainLabel("other"): "true"},
		rv:      "42",
		wantErr: drain.ErrNotDraining,
	}, {
		name:    "no resourceVersion",
		labels:  map[string]string{v1alpha1.DrainLabel(ring): "true"},
		wantErr: errors.New("any"),
	}} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			obj := &metav1.ObjectMeta{Name: "o", Namespace: "n", Labels: tc.labels, ResourceVersion: tc.rv}
			patch, err := drain.AcknowledgePatch(obj, ring)
			if tc.wantErr != nil {
				g.Expect(err).To(HaveOccurred())
				if errors.Is(tc.wantErr, drain.ErrNotDraining) {
					g.Expect(err).To(MatchError(drain.ErrNotDraining))
				}
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(json.Valid(patch)).To(BeTrue())
			g.Expect(string(patch)).To(MatchJSON(tc.want))
		})
	}
}

// TestAcknowledge runs against a real API server: the merge patch must remove
// exactly the two labels and must be refused when the object changed since it
// was read.
func TestAcknowledge(t *testing.T) {
	env, err := testenv.Start(testenv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stopping control plane: %v", err)
		}
	})
	c := env.Client

	create := func(t *testing.T, ns string, labels map[string]string) *corev1.ConfigMap {
		t.Helper()
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{GenerateName: "cm-", Namespace: ns, Labels: labels}}
		if err := c.Create(context.Background(), cm); err != nil {
			t.Fatal(err)
		}
		return cm
	}
	draining := func() map[string]string {
		return map[string]string{v1alpha1.ShardLabel(ring): "a", v1alpha1.DrainLabel(ring): "true", "app": "x",
			v1alpha1.ShardLabel("other"): "b"}
	}

	t.Run("hands the object over to the drain's target and changes nothing else", func(t *testing.T) {
		g := NewWithT(t)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		labels := draining()
		labels[v1alpha1.DrainLabel(ring)] = "c"
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{GenerateName: "cm-", Namespace: env.Namespace(t), Labels: labels,
			Annotations: map[string]string{
				v1alpha1.DrainStartedAnnotation(ring):    "2026-01-02T03:04:05.000Z",
				v1alpha1.DrainStartedAnnotation("other"): "2026-01-02T03:04:05.000Z",
				"note":                                   "kept",
			}}}
		g.Expect(c.Create(ctx, cm)).To(Succeed())

		g.Expect(drain.Acknowledge(ctx, c, cm.DeepCopy(), ring)).To(Succeed())

		got := &corev1.ConfigMap{}
		g.Expect(c.Get(ctx, client.ObjectKeyFromObject(cm), got)).To(Succeed())
		g.Expect(got.Labels).To(Equal(map[string]string{v1alpha1.ShardLabel(ring): "c", "app": "x", v1alpha1.ShardLabel("other"): "b"}))
		g.Expect(got.Annotations).To(Equal(map[string]string{
			v1alpha1.DrainStartedAnnotation("other"): "2026-01-02T03:04:05.000Z",
			"note":                                   "kept",
		}), "the ring's drain start goes with the drain; nothing else changes")
	})

	t.Run("a drain naming no target: removes both labels and nothing else", func(t *testing.T) {
		g := NewWithT(t)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		cm := create(t, env.Namespace(t), draining())

		g.Expect(drain.Acknowledge(ctx, c, cm.DeepCopy(), ring)).To(Succeed())

		got := &corev1.ConfigMap{}
		g.Expect(c.Get(ctx, client.ObjectKeyFromObject(cm), got)).To(Succeed())
		g.Expect(got.Labels).To(Equal(map[string]string{"app": "x", v1alpha1.ShardLabel("other"): "b"}))
	})

	t.Run("metadata-only object", func(t *testing.T) {
		g := NewWithT(t)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		cm := create(t, env.Namespace(t), draining())
		meta := &metav1.PartialObjectMetadata{}
		meta.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("ConfigMap"))
		g.Expect(c.Get(ctx, client.ObjectKeyFromObject(cm), meta)).To(Succeed())

		g.Expect(drain.Acknowledge(ctx, c, meta, ring)).To(Succeed())
		g.Expect(meta.Labels).NotTo(HaveKey(v1alpha1.ShardLabel(ring)), "obj is updated from the answer")

		got := &corev1.ConfigMap{}
		g.Expect(c.Get(ctx, client.ObjectKeyFromObject(cm), got)).To(Succeed())
		g.Expect(got.Labels).NotTo(HaveKey(v1alpha1.ShardLabel(ring)))
		g.Expect(got.Labels).NotTo(HaveKey(v1alpha1.DrainLabel(ring)))
	})

	t.Run("stale object is refused with a conflict", func(t *testing.T) {
		g := NewWithT(t)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		cm := create(t, env.Namespace(t), draining())
		stale := cm.DeepCopy()

		// The sharder withdraws the drain and reassigns in between.
		changed := cm.DeepCopy()
		delete(changed.Labels, v1alpha1.DrainLabel(ring))
		changed.Labels[v1alpha1.ShardLabel(ring)] = "c"
		g.Expect(c.Update(ctx, changed)).To(Succeed())

		err := drain.Acknowledge(ctx, c, stale, ring)
		g.Expect(apierrors.IsConflict(err)).To(BeTrue(), "got %v", err)

		got := &corev1.ConfigMap{}
		g.Expect(c.Get(ctx, client.ObjectKeyFromObject(cm), got)).To(Succeed())
		g.Expect(got.Labels).To(HaveKeyWithValue(v1alpha1.ShardLabel(ring), "c"))
	})

	t.Run("object without drain label is left alone", func(t *testing.T) {
		g := NewWithT(t)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		cm := create(t, env.Namespace(t), map[string]string{v1alpha1.ShardLabel(ring): "a"})

		g.Expect(drain.Acknowledge(ctx, c, cm.DeepCopy(), ring)).To(MatchError(drain.ErrNotDraining))

		got := &corev1.ConfigMap{}
		g.Expect(c.Get(ctx, client.ObjectKeyFromObject(cm), got)).To(Succeed())
		g.Expect(got.Labels).To(HaveKeyWithValue(v1alpha1.ShardLabel(ring), "a"))
	})

	t.Run("deleted object", func(t *testing.T) {
		g := NewWithT(t)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		cm := create(t, env.Namespace(t), draining())
		g.Expect(c.Delete(ctx, cm.DeepCopy())).To(Succeed())

		err := drain.Acknowledge(ctx, c, cm.DeepCopy(), ring)
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "got %v", err)
	})
}
