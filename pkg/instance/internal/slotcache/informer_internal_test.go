package slotcache

import (
	"context"
	"slices"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// TestHandOverInterleavesGroups: the groups handed over together are told
// to a handler one object of each group in turn, so that a controller's
// queue starts on every group (and slot) at once instead of on one group
// after another: at a million objects a new instance is told of 90,000
// objects in a dozen groups, and the first object of the last group would
// otherwise wait behind all the others.
func TestHandOverInterleavesGroups(t *testing.T) {
	c := &Cache{
		count: 256,
		label: v1alpha1.SlotLabel("widgets"),
		ring:  map[schema.GroupKind]ringKind{{Kind: "ConfigMap"}: {obj: &corev1.ConfigMap{}, namespaced: true}},
	}
	f := newFan(c, informerKey{gvk: corev1.SchemeGroupVersion.WithKind("ConfigMap")}, &corev1.ConfigMap{})
	var told []string
	r := &registration{f: f, fwd: map[*group]*forwarder{}, delivered: map[int]map[string]seen{},
		handler: toolscache.ResourceEventHandlerFuncs{AddFunc: func(obj any) { told = append(told, obj.(*corev1.ConfigMap).Name) }}}
	part := func(num int, slot int, names ...string) groupHandOver {
		h := groupHandOver{num: num, next: &group{num: num, slots: []int{slot}}, listed: true, keep: map[int]bool{slot: true}}
		for _, name := range names {
			h.snapshot = append(h.snapshot, client.Object(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
				Namespace: "ns", Name: name, UID: types.UID("uid-" + name), ResourceVersion: "1",
				Labels: map[string]string{c.label: strconv.Itoa(slot)},
			}}))
		}
		return h
	}
	// Slots 0 (group 0), 4 (group 1) and 8 (group 2).
	r.handOver(context.Background(), []groupHandOver{part(0, 0, "a1", "a2", "a3"), part(1, 4, "b1"), part(2, 8, "c1", "c2")})
	want := []string{"a1", "b1", "c1", "a2", "c2", "a3"}
	if !slices.Equal(told, want) {
		t.Fatalf("told %v, want %v", told, want)
	}
	for num, n := range map[int]int{0: 3, 1: 1, 2: 2} {
		if got := len(r.delivered[num]); got != n {
			t.Errorf("group %d: %d objects recorded as told, want %d", num, got, n)
		}
	}
}
