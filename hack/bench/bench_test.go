package main

import (
	"context"
	"os"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/internal/testenv"
)

var suite testenv.Suite // the control plane, started for the first test that calls env

func env() *testenv.Env { return suite.Env() }

func TestMain(m *testing.M) {
	os.Exit(testenv.Run(m, &suite, testenv.Options{}))
}

// TestFloorPatchesChangeEveryObject: a floor measurement writes a new
// value of its label on each of its objects, once, and reports the rate.
func TestFloorPatchesChangeEveryObject(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := env().Namespace(t)
	const objects = 20
	g.Expect(createObjects(ctx, env().Client, ns, "floor", objects, 4)).To(Succeed())
	p, err := newFloorPatcher(env().Config, ns, 4, objects)
	g.Expect(err).NotTo(HaveOccurred())

	for round, want := range []string{"1", "2"} {
		f, err := p.measure(ctx, "test", objects+5) // capped at the objects there are
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(f.patches).To(Equal(objects))
		g.Expect(f.rate()).To(BeNumerically(">", 0))
		list := &corev1.ConfigMapList{}
		g.Expect(env().Client.List(ctx, list, client.InNamespace(ns))).To(Succeed())
		written := 0
		for _, cm := range list.Items {
			if strings.HasPrefix(cm.Name, "floor-") {
				g.Expect(cm.Labels).To(HaveKeyWithValue(floorLabel, want), "round %d", round)
				written++
			}
		}
		g.Expect(written).To(Equal(objects))
	}
}

func TestFloorTimeFor(t *testing.T) {
	g := NewWithT(t)
	f := floor{patches: 500, took: 2_000_000_000} // 250/s
	g.Expect(f.timeFor(1000).Seconds()).To(BeNumerically("~", 4, 1e-9))
}

// TestFloorLabelsSetAndRemove: the floor of the sharder's own writes sets
// the given label to each object's value, and removes it on an empty value.
func TestFloorLabelsSetAndRemove(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := env().Namespace(t)
	const objects = 12
	g.Expect(createObjects(ctx, env().Client, ns, ringObjectPrefix, objects, 4)).To(Succeed())
	p, err := newFloorPatcher(env().Config, ns, 4, objects)
	g.Expect(err).NotTo(HaveOccurred())
	const key = "shard.sharder.dev/test"
	values := []string{"a", "b", "c"}

	f, err := p.measureLabels(ctx, "set", ns, ringObjectPrefix, key, objects, func(i int) string { return values[i%3] })
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(f.patches).To(Equal(objects))
	g.Expect(f.rate()).To(BeNumerically(">", 0))
	for i := range objects {
		cm := &corev1.ConfigMap{}
		g.Expect(env().Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: objectName(ringObjectPrefix, i)}, cm)).To(Succeed())
		g.Expect(cm.Labels).To(HaveKeyWithValue(key, values[i%3]))
	}

	_, err = p.measureLabels(ctx, "removed", ns, ringObjectPrefix, key, objects, func(int) string { return "" })
	g.Expect(err).NotTo(HaveOccurred())
	for i := range objects {
		cm := &corev1.ConfigMap{}
		g.Expect(env().Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: objectName(ringObjectPrefix, i)}, cm)).To(Succeed())
		g.Expect(cm.Labels).NotTo(HaveKey(key))
	}
}
