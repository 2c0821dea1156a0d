package instance

import (
	"context"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/sharder-dev/sharder/pkg/instance/internal/inflight"
	"github.com/sharder-dev/sharder/pkg/instance/leaseholder"
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

// notFoundReader answers every read with NotFound and counts the reads.
type notFoundReader struct {
	client.Reader
	reads int
}

func (r *notFoundReader) Get(_ context.Context, key client.ObjectKey, _ client.Object, _ ...client.GetOption) error {
	r.reads++
	return apierrors.NewNotFound(schema.GroupResource{Resource: "configmaps"}, key.Name)
}

// TestHandOverMemoryFollowsTheClock checks that the reconciler tells the
// time with Options.Lease.Clock: within handOverMemory of a hand-over on that
// clock a request for the object is dropped without a read, after it the
// API server decides.
func TestHandOverMemoryFollowsTheClock(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	reader := &notFoundReader{}
	inst := &Instance{opts: Options{Ring: "web", Lease: leaseholder.Options{Clock: clk}}, apiReader: reader}
	var calls int
	r := &reconciler{
		inst: inst,
		gvk:  schema.GroupVersionKind{Version: "v1", Kind: "ConfigMap"},
		next: reconcile.Func(func(context.Context, reconcile.Request) (reconcile.Result, error) {
			calls++
			return reconcile.Result{}, nil
		}),
	}
	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "a"}}
	inst.handedOver.add(inflight.Key{GroupKind: r.gvk.GroupKind(), NamespacedName: req.NamespacedName}, clk.Now())

	clk.Step(handOverMemory - time.Second)
	if _, err := r.absent(context.Background(), req); err != nil || reader.reads != 0 || calls != 0 {
		t.Fatalf("within handOverMemory: err %v, %d reads, %d calls; want the request dropped without a read", err, reader.reads, calls)
	}
	clk.Step(time.Second)
	if _, err := r.absent(context.Background(), req); err != nil || reader.reads != 1 || calls != 1 {
		t.Fatalf("after handOverMemory: err %v, %d reads, %d calls; want one read and the deletion reconciled", err, reader.reads, calls)
	}
}
