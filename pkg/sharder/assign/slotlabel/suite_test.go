package slotlabel_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/sharder-dev/sharder/internal/testenv"
	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/sharder/assign/slotlabel"
	"github.com/sharder-dev/sharder/pkg/slots"
)

var suite testenv.Suite

func env() *testenv.Env { return suite.Env() }

func TestMain(m *testing.M) {
	logger := logr.Discard()
	if os.Getenv("SHARDER_TEST_LOG") != "" {
		logger = zap.New(zap.UseDevMode(true))
	}
	ctrl.SetLogger(logger)
	os.Exit(testenv.Run(m, &suite, testenv.Options{}))
}

const (
	timeout = 10 * time.Second
	poll    = 20 * time.Millisecond
	// quiet is how long a Consistently watches that nothing is written.
	quiet = time.Second
)

// newRing returns a ring of unit Slots named after ns, of ConfigMaps with
// Secrets as controlled resource, selecting the namespaces labelled with
// selectorLabel(ring). mutate may change the spec. The ring is not
// created: the labeler reads it from its Options.
func newRing(ns string, mutate func(*v1alpha1.ControllerRingSpec)) *v1alpha1.ControllerRing {
	r := &v1alpha1.ControllerRing{
		ObjectMeta: metav1.ObjectMeta{Name: ns, UID: types.UID("uid-" + ns)},
		Spec: v1alpha1.ControllerRingSpec{
			LeaseNamespace: ns,
			Resources: []v1alpha1.RingResource{{
				Resource:            "configmaps",
				ControlledResources: []metav1.GroupResource{{Resource: "secrets"}},
			}},
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{selectorLabel(ns): "yes"}},
			Assignment: &v1alpha1.RingAssignment{
				Unit:  v1alpha1.AssignmentUnitSlots,
				Slots: &v1alpha1.RingSlots{Count: 128},
			},
		},
	}
	if mutate != nil {
		mutate(&r.Spec)
	}
	return r
}

// selectorLabel is the Namespace label the ring of newRing selects.
func selectorLabel(ring string) string { return "slotlabel-test.sharder.dev/" + ring }

// selectNamespace labels namespace so that ring selects it.
func selectNamespace(t testing.TB, ring, namespace string) {
	t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:"yes"}}}`, selectorLabel(ring))
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
	if err := env().Client.Patch(context.Background(), ns, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatalf("labelling namespace %s: %v", namespace, err)
	}
}

// startLabeler runs the labeler of ring until the test ends and waits for
// its caches to sync. Its events go to the returned recorder.
// mutate, when set, may change the options.
func startLabeler(t testing.TB, ring *v1alpha1.ControllerRing, mutate func(*slotlabel.Options)) (*slotlabel.Labeler, *events) {
	t.Helper()
	mc, err := metadata.NewForConfig(env().Config)
	if err != nil {
		t.Fatal(err)
	}
	rec := &events{FakeRecorder: record.NewFakeRecorder(1000)}
	opts := slotlabel.Options{
		Ring:         ring,
		Client:       mc,
		Mapper:       env().Client.RESTMapper(),
		Recorder:     rec,
		FieldManager: "slotlabel-test",
		Workers:      4,
	}
	if mutate != nil {
		mutate(&opts)
	}
	l, err := slotlabel.New(opts)
	if err != nil {
		t.Fatalf("creating labeler: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("labeler: %v", err)
		}
	})
	NewWithT(t).Eventually(l.HasSynced, timeout, poll).Should(BeTrue(), "the labeler's caches sync")
	return l, rec
}

// events collects what a FakeRecorder records.
type events struct {
	*record.FakeRecorder
	mu  sync.Mutex
	all []string
}

// recorded returns every event recorded so far, as "<type> <reason> <message>".
func (e *events) recorded() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	for {
		select {
		case ev := <-e.Events:
			e.all = append(e.all, ev)
		default:
			return append([]string(nil), e.all...)
		}
	}
}

func configMap(ns, name string, labels map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels}}
}

// secretOf returns a Secret controlled by owner (of kind ownerKind).
func secretOf(name string, ownerKind string, owner client.Object) *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{
		Namespace: owner.GetNamespace(), Name: name,
		OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "v1", Kind: ownerKind, Name: owner.GetName(), UID: owner.GetUID(), Controller: ptr.To(true),
		}},
	}}
}

func create(t testing.TB, objs ...client.Object) {
	t.Helper()
	for _, obj := range objs {
		if err := env().Client.Create(context.Background(), obj); err != nil {
			t.Fatalf("creating %s: %v", obj.GetName(), err)
		}
	}
}

// read returns the metadata of the object kind ns/name as the API server
// has it.
func read(g Gomega, kind, ns, name string) *metav1.PartialObjectMetadata {
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind(kind))
	g.Expect(env().Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, m)).To(Succeed())
	return m
}

// slotOf returns the slot label of ring on kind ns/name, "" when none.
func slotOf(g Gomega, ring, kind, ns, name string) string {
	return read(g, kind, ns, name).Labels[v1alpha1.SlotLabel(ring)]
}

// mainSlot is the slot the labeler must give the ConfigMap ns/name.
func mainSlot(ring *v1alpha1.ControllerRing, ns, name string) string {
	return strconv.Itoa(slots.ForMainObject(&ring.Spec, "", "ConfigMap", ns, name))
}

// resourceVersion returns the resourceVersion of kind ns/name as a number.
func resourceVersion(g Gomega, kind, ns, name string) int64 {
	rv, err := strconv.ParseInt(read(g, kind, ns, name).ResourceVersion, 10, 64)
	g.Expect(err).NotTo(HaveOccurred())
	return rv
}

// otherSlot returns a slot of ring that is not want.
func otherSlot(ring *v1alpha1.ControllerRing, want string) string {
	w, _ := strconv.Atoi(want)
	return strconv.Itoa((w + 1) % ring.Spec.EffectiveSlotCount())
}

// hasEvent matches an event list holding one of reason whose message
// names name.
func hasEvent(reason, name string) OmegaMatcher {
	return ContainElement(And(HavePrefix("Warning "+reason+" "), WithTransform(func(s string) bool {
		return strings.Contains(s, name)
	}, BeTrue())))
}

// interfering is a metadata client whose first patch of each object is
// preceded by another writer's change of that object, so that the patch,
// locked on the resourceVersion the labeler read, fails with a conflict.
type interfering struct {
	metadata.Interface
	mu       sync.Mutex
	touched  map[string]bool
	attempts map[string]int
}

func (c *interfering) Resource(gvr schema.GroupVersionResource) metadata.Getter {
	return interferingResource{Getter: c.Interface.Resource(gvr), c: c, gvr: gvr}
}

type interferingResource struct {
	metadata.Getter
	c         *interfering
	gvr       schema.GroupVersionResource
	namespace string
}

func (r interferingResource) Namespace(ns string) metadata.ResourceInterface {
	return interferingResource{Getter: r.Getter, c: r.c, gvr: r.gvr, namespace: ns}
}

func (r interferingResource) Patch(ctx context.Context, name string, pt types.PatchType, data []byte,
	opts metav1.PatchOptions, sub ...string) (*metav1.PartialObjectMetadata, error) {
	key := r.gvr.Resource + "/" + r.namespace + "/" + name
	r.c.mu.Lock()
	first := !r.c.touched[key]
	r.c.touched[key] = true
	r.c.attempts[key]++
	r.c.mu.Unlock()
	if first {
		touch := []byte(`{"metadata":{"annotations":{"slotlabel-test.sharder.dev/touched":"yes"}}}`)
		if _, err := r.Getter.Namespace(r.namespace).Patch(ctx, name, types.MergePatchType, touch, metav1.PatchOptions{}); err != nil {
			return nil, err
		}
	}
	return r.Getter.Namespace(r.namespace).Patch(ctx, name, pt, data, opts, sub...)
}

func (c *interfering) attemptsOf(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.attempts[key]
}
