package instance_test

import (
	"context"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// watchValve stalls the watches of one connection to the API server while
// it is shut, as a half-open connection or a proxy that holds streams would:
// new watch requests get no answer and the events of open ones are held
// back, while every other request (the instance's Lease renewals, its
// reads and writes) passes.
type watchValve struct {
	mu      sync.Mutex
	flowing chan struct{} // closed while the valve is open
}

func newWatchValve() *watchValve {
	v := &watchValve{flowing: make(chan struct{})}
	close(v.flowing)
	return v
}

// shut stalls every watch from now on.
func (v *watchValve) shut() {
	v.mu.Lock()
	defer v.mu.Unlock()
	select {
	case <-v.flowing:
		v.flowing = make(chan struct{})
	default:
	}
}

// open lets the watches flow again, with what they held back.
func (v *watchValve) open() {
	v.mu.Lock()
	defer v.mu.Unlock()
	select {
	case <-v.flowing:
	default:
		close(v.flowing)
	}
}

// wait blocks while the valve is shut, or until ctx ends.
func (v *watchValve) wait(ctx context.Context) error {
	v.mu.Lock()
	flowing := v.flowing
	v.mu.Unlock()
	select {
	case <-flowing:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// wrap is a rest.Config WrapTransport.
func (v *watchValve) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		if req.URL.Query().Get("watch") != "true" {
			return rt.RoundTrip(req)
		}
		if err := v.wait(req.Context()); err != nil {
			return nil, err
		}
		resp, err := rt.RoundTrip(req)
		if err != nil {
			return nil, err
		}
		resp.Body = &valvedBody{ReadCloser: resp.Body, v: v, ctx: req.Context()}
		return resp, nil
	})
}

// valvedBody holds back what a watch stream delivers while its valve is shut.
type valvedBody struct {
	io.ReadCloser
	v   *watchValve
	ctx context.Context
}

func (b *valvedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if werr := b.v.wait(b.ctx); werr != nil {
		return 0, werr
	}
	return n, err
}

// TestStaleWatchStopsReconcilesBeforeAForcedMove: an instance's watches
// stall while its writes still pass. It keeps renewing its Lease, so the
// sharder counts it ready, and it never sees the drain the sharder requests
// when a second instance joins: the sharder forces the move. The stalled
// instance's cache still shows the object as its own and its reconciler
// asks to run again and again, yet it stops reconciling once its own Lease
// renewals no longer come back through its watch, and the sharder waits the
// watch lag the instance promises on its Lease before it assigns the
// object: no run of the old instance overlaps or follows the new one's.
func TestStaleWatchStopsReconcilesBeforeAForcedMove(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	ring := ns
	startSharder(t)
	createRing(t, ns, 2*time.Second)
	name := nameMovingTo(t, ns, "i2", "i1", "i2")

	rec := newRecorder()
	valve := newWatchValve()
	cfg := rest.CopyConfig(env().Config)
	cfg.Wrap(valve.wrap)
	startInstance(t, instanceConfig{ring: ring, namespace: ns, id: "i1", rec: rec, restConfig: cfg,
		requeueAfter: 100 * time.Millisecond, work: 50 * time.Millisecond})
	t.Cleanup(valve.open) // before i1 stops
	createConfigMap(t, ns, name, nil)
	g.Eventually(func() []interval { return rec.runsOf(name, "i1") }, 30*time.Second).ShouldNot(BeEmpty())

	// The Lease carries the promise: the instance's renew deadline.
	lease := &coordinationv1.Lease{}
	g.Expect(env().Client.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "i1"}, lease)).To(Succeed())
	g.Expect(lease.Annotations).To(HaveKeyWithValue(v1alpha1.AnnotationMaxWatchLag, "2s"))

	valve.shut()
	startInstance(t, instanceConfig{ring: ring, namespace: ns, id: "i2", rec: rec,
		requeueAfter: 100 * time.Millisecond, work: 50 * time.Millisecond})

	var first time.Time
	g.Eventually(func() bool {
		runs := rec.runsOf(name, "i2")
		if len(runs) == 0 {
			return false
		}
		first = runs[0].start
		return true
	}, 60*time.Second).Should(BeTrue(), "i2 reconciles the object")
	// i1 asks to reconcile every 100ms from its stalled cache: any run it
	// were still let through would show up here.
	g.Consistently(func(g Gomega) {
		for _, run := range rec.runsOf(name, "i1") {
			g.Expect(run.end.Before(first)).To(BeTrue(), "i1 ran %v–%v, after i2 started at %v",
				run.start.Format(time.StampMicro), run.end.Format(time.StampMicro), first.Format(time.StampMicro))
		}
	}, 2*time.Second, 100*time.Millisecond).Should(Succeed())
	g.Expect(rec.overlaps()).To(BeEmpty())
}
