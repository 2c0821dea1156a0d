package slottable_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/sharder-dev/sharder/internal/fixture"
	"github.com/sharder-dev/sharder/internal/testenv"
	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/sharder/leasecontroller"
	"github.com/sharder-dev/sharder/pkg/sharder/slottable"
	"github.com/sharder-dev/sharder/pkg/slots"
)

// sharderIdentity is the identity of the lease and slot table controllers
// under test.
const sharderIdentity = "sharder:test"

var suite testenv.Suite

func env() *testenv.Env { return suite.Env() }

func TestMain(m *testing.M) {
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr)))
	SetDefaultEventuallyTimeout(15 * time.Second)
	SetDefaultEventuallyPollingInterval(20 * time.Millisecond)
	SetDefaultConsistentlyDuration(time.Second)
	SetDefaultConsistentlyPollingInterval(50 * time.Millisecond)
	scheme := testenv.DefaultScheme()
	utilruntime.Must(v1alpha1.AddToScheme(scheme))
	os.Exit(testenv.Run(m, &suite, testenv.Options{CRDDirectoryPaths: []string{"config/crd/bases"}, Scheme: scheme}))
}

// write is a table write of the controller as its client saw it return:
// the table written, or the error.
type write struct {
	at    time.Time
	table *v1alpha1.SlotTable
	err   error
}

// sharder is one test's lease controller and slot table controller, in one
// manager whose requests pass a recorder of the ring's status writes.
type sharder struct {
	registry *leasecontroller.Registry

	mu     sync.Mutex
	writes []write
	// interfere, when set, runs before the next status write of the
	// controller (once): another writer of the table.
	interfere func()
}

// successful returns the tables the controller wrote.
func (s *sharder) successful() []write {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []write
	for _, w := range s.writes {
		if w.err == nil {
			out = append(out, w)
		}
	}
	return out
}

// failed returns how many of the controller's writes failed.
func (s *sharder) failed() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, w := range s.writes {
		if w.err != nil {
			n++
		}
	}
	return n
}

// interfereOnce sets the interference that runs before the controller's
// next status write.
func (s *sharder) interfereOnce(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.interfere = f
}

// startSharder starts a lease controller and a slot table controller for
// ring, whose Leases are in namespace, until the test ends. interfere, if
// given, runs once before the controller's first status write.
func startSharder(t *testing.T, ring, namespace string, opts slottable.Options, interfere ...func()) *sharder {
	t.Helper()
	return startSharderWith(t, ring, namespace, leasecontroller.Options{}, opts, interfere...)
}

// startSharderWith is startSharder with the lease controller's options
// (its Registry and Identity are the test's).
func startSharderWith(t *testing.T, ring, namespace string, lcOpts leasecontroller.Options, opts slottable.Options, interfere ...func()) *sharder {
	t.Helper()
	s := &sharder{registry: leasecontroller.NewRegistry()}
	if len(interfere) > 0 {
		s.interfere = interfere[0]
	}
	mgrOpts := env().ManagerOptions()
	byObject := leasecontroller.CacheByObject()
	byObject[&v1alpha1.ControllerRing{}] = cache.ByObject{Field: fields.OneTermEqualSelector("metadata.name", ring)}
	mgrOpts.Cache = cache.Options{ByObject: byObject, DefaultNamespaces: map[string]cache.Config{namespace: {}}}
	cfg := rest.CopyConfig(env().Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &recorder{next: rt, s: s} })
	mgr := env().NewManager(t, cfg, mgrOpts)
	lcOpts.Registry, lcOpts.Identity = s.registry, sharderIdentity
	lc, err := leasecontroller.New(lcOpts)
	if err != nil {
		t.Fatal(err)
	}
	if err := lc.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	opts.Registry, opts.Identity = s.registry, sharderIdentity
	c, err := slottable.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	testenv.StartManager(t, mgr)
	return s
}

// recorder passes the manager's requests on and records the ring status
// writes (the table writes), running the interference first when one is
// set.
type recorder struct {
	next http.RoundTripper
	s    *sharder
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodPatch || !strings.Contains(req.URL.Path, "/controllerrings/") || !strings.HasSuffix(req.URL.Path, "/status") {
		return r.next.RoundTrip(req)
	}
	s := r.s
	s.mu.Lock()
	interfere := s.interfere
	s.interfere = nil
	s.mu.Unlock()
	if interfere != nil {
		interfere()
	}
	resp, err := r.next.RoundTrip(req)
	w := write{err: err}
	if err == nil {
		body, rerr := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(body))
		ring := &v1alpha1.ControllerRing{}
		switch {
		case rerr != nil:
			w.err = rerr
		case resp.StatusCode != http.StatusOK:
			w.err = fmt.Errorf("status %d", resp.StatusCode)
		default:
			w.err = json.Unmarshal(body, ring)
		}
		w.table = ring.Status.Slots
	}
	w.at = time.Now()
	s.mu.Lock()
	s.writes = append(s.writes, w)
	s.mu.Unlock()
	return resp, err
}

var ringCounter struct {
	sync.Mutex
	n int
}

// newRing creates a ring of unit Slots with count slots and a fresh lease
// namespace, deleted at the end of the test.
func newRing(t *testing.T, count int32, mutate ...func(*v1alpha1.ControllerRing)) (*v1alpha1.ControllerRing, string) {
	t.Helper()
	namespace := env().Namespace(t)
	ringCounter.Lock()
	ringCounter.n++
	name := fmt.Sprintf("slots-%d", ringCounter.n)
	ringCounter.Unlock()
	mutate = append([]func(*v1alpha1.ControllerRing){func(r *v1alpha1.ControllerRing) {
		r.Spec.Assignment = &v1alpha1.RingAssignment{Unit: v1alpha1.AssignmentUnitSlots, Slots: &v1alpha1.RingSlots{Count: count}}
	}}, mutate...)
	ring := fixture.Ring(name, namespace, nil, mutate...)
	fixture.Create(t, env().Client, ring)
	return ring, namespace
}

// createLease creates an instance Lease renewed now for seconds.
func createLease(t *testing.T, ring, namespace, id string, seconds int32, mutate ...func(*coordinationv1.Lease)) {
	t.Helper()
	lease := fixture.InstanceLease(ring, namespace, id, time.Now(), time.Duration(seconds)*time.Second, mutate...)
	NewWithT(t).Expect(env().Client.Create(context.Background(), lease)).To(Succeed())
}

// updateLease changes a Lease read from the API server, retrying on
// conflicts.
func updateLease(g Gomega, namespace, name string, change func(*coordinationv1.Lease)) {
	g.Eventually(func() error {
		lease, err := fixture.GetLease(env().Client, namespace, name)()
		if err != nil {
			return err
		}
		change(lease)
		return env().Client.Update(context.Background(), lease)
	}).Should(Succeed())
}

// acknowledge writes instance id's acknowledgement of revision of ring's
// table on its Lease, as the instance does with a renewal.
func acknowledge(g Gomega, ring *v1alpha1.ControllerRing, namespace, id string, revision int64) {
	updateLease(g, namespace, id, func(l *coordinationv1.Lease) {
		if l.Annotations == nil {
			l.Annotations = map[string]string{}
		}
		l.Annotations[v1alpha1.AnnotationSlotsAcknowledged] = slots.FormatAcknowledgement(ring.UID, revision)
		l.Spec.RenewTime = ptr.To(metav1.NewMicroTime(time.Now()))
	})
}

// getRing reads ring from the API server.
func getRing(name string) (*v1alpha1.ControllerRing, error) {
	ring := &v1alpha1.ControllerRing{}
	err := env().Client.Get(context.Background(), client.ObjectKey{Name: name}, ring)
	return ring, err
}

// tableOf reads ring's slot table from the API server; it fails on a table
// that is not valid (a slot granted twice among them).
func tableOf(ring *v1alpha1.ControllerRing) func() (slots.Table, error) {
	return func() (slots.Table, error) {
		r, err := getRing(ring.Name)
		if err != nil {
			return slots.Table{}, err
		}
		return slots.FromStatus(int(ring.Spec.Assignment.Slots.Count), r.Status.Slots)
	}
}

// held is what a table grants and releases per instance.
type held struct {
	granted, releasing int
}

// holdings returns per holder how many slots it holds, and the unassigned
// slots under "".
func holdings(t slots.Table) map[string]held {
	out := map[string]held{}
	for _, s := range t.Slots {
		h := out[s.Holder]
		if s.Releasing {
			h.releasing++
		} else {
			h.granted++
		}
		out[s.Holder] = h
	}
	return out
}

// balanced reports whether t grants every slot, releases none, to exactly
// ids, each within one slot of the others.
func balanced(ids ...string) func(slots.Table) bool {
	return func(t slots.Table) bool {
		h := holdings(t)
		if len(h) != len(ids) {
			return false
		}
		lo, hi := len(t.Slots), 0
		for _, id := range ids {
			n, ok := h[id]
			if !ok || n.releasing > 0 {
				return false
			}
			lo, hi = min(lo, n.granted), max(hi, n.granted)
		}
		return hi-lo <= 1
	}
}

// holders returns the instances t names, sorted.
func holders(t slots.Table) []string {
	var out []string
	for _, s := range t.Slots {
		if s.Holder != "" && !slices.Contains(out, s.Holder) {
			out = append(out, s.Holder)
		}
	}
	slices.Sort(out)
	return out
}

// must returns v, panicking on err (in Consistently and after a success).
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// mustJSON marshals v.
func mustJSON(v any) []byte { return must(json.Marshal(v)) }

// settled waits until the controller's record holds every write of ring's
// table (a write is recorded just after it landed), and returns their
// number. others is the number of writes of others, which raised the
// revision too.
func (s *sharder) settled(g Gomega, ring *v1alpha1.ControllerRing, others int) int {
	var n int
	g.Eventually(func(g Gomega) {
		tbl, err := tableOf(ring)()
		g.Expect(err).NotTo(HaveOccurred())
		n = len(s.successful())
		g.Expect(int64(n + others)).To(Equal(tbl.Revision))
	}).Should(Succeed())
	return n
}
