package instance

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sharder-dev/sharder/pkg/instance/internal/inflight"
)

func TestHandOversRemembered(t *testing.T) {
	key := func(name string) inflight.Key {
		return inflight.Key{GroupKind: schema.GroupKind{Kind: "ConfigMap"}, NamespacedName: types.NamespacedName{Namespace: "ns", Name: name}}
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var h handOvers
	if h.recent(key("a"), t0) {
		t.Fatal("nothing handed over yet")
	}
	h.add(key("a"), t0)
	if !h.recent(key("a"), t0.Add(handOverMemory-time.Second)) {
		t.Error("a handed-over object is remembered within handOverMemory")
	}
	if h.recent(key("b"), t0) {
		t.Error("another object is not")
	}
	if h.recent(key("a"), t0.Add(handOverMemory)) {
		t.Error("nor after handOverMemory: a late request reads the API server")
	}
	h.forget(key("a"))
	if h.recent(key("a"), t0) {
		t.Error("an object assigned here again is forgotten")
	}

	// Old entries are swept as new ones are added.
	h.add(key("a"), t0)
	h.add(key("b"), t0.Add(2*handOverMemory))
	if _, ok := h.at[key("a")]; ok || len(h.at) != 1 {
		t.Errorf("entries older than handOverMemory are swept: %v", h.at)
	}
}
