package assign_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/sharder/assign"
	"github.com/sharder-dev/sharder/pkg/sharder/leasecontroller"
)

// gate holds the first request a test picks until the test opens the gate,
// as a sharder frozen (SIGSTOP, a long garbage collection) between deciding
// a write and sending it would, and records the status code that request got.
type gate struct {
	pick func(*http.Request) bool

	once   sync.Once
	held   chan struct{} // closed when the picked request arrives
	open   chan struct{} // closed by the test
	answer chan int      // the picked request's status code (0: transport error)
}

func newGate(pick func(*http.Request) bool) *gate {
	return &gate{pick: pick, held: make(chan struct{}), open: make(chan struct{}), answer: make(chan int, 1)}
}

// config returns a copy of cfg whose requests pass through the gate.
func (gt *gate) config(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
			if !gt.pick(req) {
				return rt.RoundTrip(req)
			}
			first := false
			gt.once.Do(func() { first = true })
			if !first {
				return rt.RoundTrip(req)
			}
			close(gt.held)
			<-gt.open
			resp, err := rt.RoundTrip(req)
			code := 0
			if err == nil {
				code = resp.StatusCode
			}
			gt.answer <- code
			return resp, err
		})
	})
	return cfg
}

// TestStaleRelabelOfControlledObjectDoesNotLand: the sharder decides to move
// a dead instance's object and its controlled object, and the write of the
// controlled object is held (the sharder froze) while the instance comes
// back and its controller changes the object. Once released, that write,
// decided on the old state, must fail on the object's resourceVersion, as
// the main object's own write would: owner and child stay on the instance
// that came back, and neither moves.
func TestStaleRelabelOfControlledObjectDoesNotLand(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := env().Namespace(t)
	shard := v1alpha1.ShardLabel(ns)
	newRing(t, ns, func(s *v1alpha1.ControllerRingSpec) {
		s.Resources[0].ControlledResources = []metav1.GroupResource{{Resource: "secrets"}}
	})
	owner := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "owner", Labels: map[string]string{shard: "a"}}}
	g.Expect(env().Client.Create(ctx, owner)).To(Succeed())
	child := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "child", Labels: map[string]string{shard: "a"},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID, Controller: ptr.To(true)}}}}
	g.Expect(env().Client.Create(ctx, child)).To(Succeed())

	reg := leasecontroller.NewRegistry()
	reg.Set(ns, members(membership.StateReady, "a"))
	gt := newGate(func(req *http.Request) bool {
		return req.Method == http.MethodPatch && strings.HasSuffix(req.URL.Path, "/secrets/child")
	})
	stop := startSharderWith(t, gt.config(env().Config), reg, assign.Options{}, nil)
	defer stop()

	// a dies: the sharder moves its objects to b, the child first. Its
	// write is held.
	reg.Set(ns, append(members(membership.StateReady, "b"), members(membership.StateDead, "a")...))
	select {
	case <-gt.held:
	case <-time.After(timeout):
		t.Fatal("the sharder did not relabel the controlled object")
	}
	// a comes back (b goes), and a's controller updates its child.
	reg.Set(ns, members(membership.StateReady, "a"))
	g.Expect(env().Client.Patch(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "child"}},
		client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"reconciled":"by-a"}}}`)))).To(Succeed())
	close(gt.open)

	select {
	case code := <-gt.answer:
		g.Expect(code).To(Equal(http.StatusConflict), "the held relabel of the controlled object was not refused on its resourceVersion")
	case <-time.After(timeout):
		t.Fatal("the held write did not return")
	}
	g.Consistently(func(g Gomega) {
		for name, obj := range map[string]client.Object{"owner": &corev1.ConfigMap{}, "child": &corev1.Secret{}} {
			g.Expect(env().Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, obj)).To(Succeed())
			g.Expect(obj.GetLabels()).To(HaveKeyWithValue(shard, "a"), "%s moved off the instance that came back", name)
		}
	}, 2*time.Second, poll).Should(Succeed())
}

// TestStaleRingStatusDoesNotLand: a status computed before someone else
// (a newer leader) wrote the ring's status is refused on the ring's
// resourceVersion instead of replacing the newer one.
func TestStaleRingStatusDoesNotLand(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := env().Namespace(t)
	newRing(t, ns, nil)
	createConfigMaps(t, ns, "cm", 3)
	reg := leasecontroller.NewRegistry()
	reg.Set(ns, members(membership.StateReady, "a"))
	gt := newGate(func(req *http.Request) bool {
		return req.Method == http.MethodPatch && strings.HasSuffix(req.URL.Path, "/controllerrings/"+ns+"/status")
	})
	stop := startSharderWith(t, gt.config(env().Config), reg, assign.Options{}, nil)
	defer stop()
	select {
	case <-gt.held:
	case <-time.After(timeout):
		t.Fatal("the sharder did not write the ring's status")
	}
	// Another writer updates the status meanwhile.
	r := getRing(g, ns)
	updated := r.DeepCopy()
	updated.Status.UnassignedObjects = 42
	g.Expect(env().Client.Status().Patch(ctx, updated, client.MergeFrom(r))).To(Succeed())
	close(gt.open)
	select {
	case code := <-gt.answer:
		g.Expect(code).To(Equal(http.StatusConflict), "the held status write was not refused on the ring's resourceVersion")
	case <-time.After(timeout):
		t.Fatal("the held write did not return")
	}
}

// TestLabelWritesCarryADeadline: each label write asks the API server to
// give up after Options.WriteTimeout (the request's timeout parameter), so
// that a write whose admission waits for a webhook replica that does not
// answer (frozen) fails instead of landing once the webhook call times out.
func TestLabelWritesCarryADeadline(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	newRing(t, ns, nil)
	names := createConfigMaps(t, ns, "cm", 3)
	reg := leasecontroller.NewRegistry()
	reg.Set(ns, members(membership.StateReady, "a"))
	var mu sync.Mutex
	var timeouts []string
	cfg := rest.CopyConfig(env().Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
			if req.Method == http.MethodPatch && strings.Contains(req.URL.Path, "/configmaps/") && assigns(req, `":"a"`) {
				mu.Lock()
				timeouts = append(timeouts, req.URL.Query().Get("timeout"))
				mu.Unlock()
			}
			return rt.RoundTrip(req)
		})
	})
	writeTimeout := 1500 * time.Millisecond
	stop := startSharderWith(t, cfg, reg, assign.Options{WriteTimeout: writeTimeout}, nil)
	defer stop()
	g.Eventually(assigned(ns, names, on("a")), timeout, poll).Should(Succeed())
	mu.Lock()
	defer mu.Unlock()
	g.Expect(timeouts).NotTo(BeEmpty())
	g.Expect(timeouts).To(HaveEach("1.5s"), "label writes without the deadline")
}

// assigns reports whether req's body contains label, read from a copy.
func assigns(req *http.Request, label string) bool {
	if req.GetBody == nil {
		return false
	}
	body, err := req.GetBody()
	if err != nil {
		return false
	}
	defer body.Close()
	b, err := io.ReadAll(body)
	return err == nil && strings.Contains(string(b), label)
}
