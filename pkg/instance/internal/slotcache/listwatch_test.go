package slotcache_test

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/instance/internal/slotcache"
)

// requestLog records the ConfigMap requests a client sends.
type requestLog struct {
	mu   sync.Mutex
	urls []string
}

func (l *requestLog) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		if strings.Contains(r.URL.Path, "/configmaps") {
			l.mu.Lock()
			l.urls = append(l.urls, r.URL.String())
			l.mu.Unlock()
		}
		return rt.RoundTrip(r)
	})
}

func (l *requestLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.urls...)
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestGroupCachesListThenWatch: each group cache fills its informers with a
// LIST of the group's slots and then watches, never with a streaming list
// (a watch with sendInitialEvents, client-go's default since 1.35). The API
// server's watch cache answers a streaming list by building an event for
// every object of the resource, whatever the selector, and sorting them: at
// a million objects, hundreds of megabytes and seconds of CPU for each of
// an instance's group watches. A LIST it answers by filtering its objects
// in place.
func TestGroupCachesListThenWatch(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	for _, slot := range []int{0, 5, 9} {
		createConfigMap(t, ns, "s"+strconv.Itoa(slot), slot)
	}
	var log requestLog
	cfg := rest.CopyConfig(env().Config)
	cfg.Wrap(log.wrap)
	c, err := slotcache.New(cfg, slotcache.Options{
		Ring:    ring,
		Count:   count,
		Objects: []client.Object{&corev1.ConfigMap{}},
		Cache:   cache.Options{Scheme: env().Scheme, DefaultNamespaces: map[string]cache.Config{ns: {}}},
	})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(c.SetSlots(context.Background(), []int{0, 5})).To(Succeed())
	ctx := start(t, c)
	g.Expect(c.Groups()).To(Equal([]int{0, 1}))
	g.Expect(names(ctx, c, ns)).To(Equal([]string{"s0", "s5"}))

	lists := 0
	for _, u := range log.all() {
		parsed, err := url.Parse(u)
		g.Expect(err).NotTo(HaveOccurred())
		q := parsed.Query()
		g.Expect(q.Get("labelSelector")).To(ContainSubstring(v1alpha1.SlotLabel(ring)), "a ConfigMap request without the slot selector: %s", u)
		g.Expect(q.Has("sendInitialEvents")).To(BeFalse(), "a group cache streamed its list: %s", u)
		if q.Get("watch") != "true" {
			lists++
		}
	}
	g.Expect(lists).To(BeNumerically(">=", 2), "one LIST per group: %v", log.all())
	g.Eventually(func() int {
		n := 0
		for _, u := range log.all() {
			if strings.Contains(u, "watch=true") {
				n++
			}
		}
		return n
	}).Should(BeNumerically(">=", 2), "a watch per group after its LIST")
}

// TestGroupsSwitchAsTheySync: SetSlots switches each group to its new cache
// as soon as that cache synced, not once every changed group did: a group
// whose LIST is slow (a million objects behind the selector, a throttled
// client) does not hold back the reads and events of the others. (The
// cache watches two namespaces, so that its groups list themselves rather
// than in one batch: TestGroupsStartingTogetherListOnce.)
func TestGroupsSwitchAsTheySync(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	other := env().Namespace(t)
	createConfigMap(t, ns, "s0", 0)
	createConfigMap(t, ns, "s5", 5)
	// The LISTs of group 1 (slot 5) wait until released.
	release := make(chan struct{})
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	cfg := rest.CopyConfig(env().Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			q := r.URL.Query()
			if strings.Contains(r.URL.Path, "/configmaps") && q.Get("watch") != "true" && strings.Contains(q.Get("labelSelector"), "5") {
				select {
				case <-release:
				case <-r.Context().Done():
					return nil, r.Context().Err()
				}
			}
			return rt.RoundTrip(r)
		})
	})
	c, err := slotcache.New(cfg, slotcache.Options{
		Ring:    ring,
		Count:   count,
		Objects: []client.Object{&corev1.ConfigMap{}},
		Cache:   cache.Options{Scheme: env().Scheme, DefaultNamespaces: map[string]cache.Config{ns: {}, other: {}}},
	})
	g.Expect(err).NotTo(HaveOccurred())
	ctx := start(t, c)
	ev := newEvents()
	inf, err := c.GetInformer(ctx, &corev1.ConfigMap{})
	g.Expect(err).NotTo(HaveOccurred())
	_, err = inf.AddEventHandler(ev)
	g.Expect(err).NotTo(HaveOccurred())

	switched := make(chan error, 1)
	go func() { switched <- c.SetSlots(ctx, []int{0, 5}) }()
	g.Eventually(func() ([]string, error) { return names(ctx, c, ns) }).Should(Equal([]string{"s0"}),
		"group 0 serves while group 1 still lists")
	g.Eventually(func() int { return ev.count("add", "s0") }).Should(Equal(1))
	g.Expect(c.Slots()).To(Equal([]int{0}))
	g.Consistently(switched, "200ms").ShouldNot(Receive(), "SetSlots returned before group 1 synced")

	releaseOnce.Do(func() { close(release) })
	g.Eventually(switched, "30s").Should(Receive(BeNil()))
	g.Expect(names(ctx, c, ns)).To(Equal([]string{"s0", "s5"}))
	g.Expect(c.Slots()).To(Equal([]int{0, 5}))
	g.Eventually(func() int { return ev.count("add", "s5") }).Should(Equal(1))
}

// TestGroupsStartingTogetherListOnce: the groups one SetSlots starts
// together fill their informers from one LIST of all their slots, each
// taking its own slots' objects, and then each watches its own slots from
// that list's resourceVersion. A LIST costs the API server a pass over
// every object of the resource whatever the selector, so a new instance of
// a big ring, granted its share in many groups at once, lists the resource
// once rather than once per group. A group started alone lists itself.
func TestGroupsStartingTogetherListOnce(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	for _, slot := range []int{0, 1, 5, 9, 13} {
		createConfigMap(t, ns, "s"+strconv.Itoa(slot), slot)
	}
	var log requestLog
	cfg := rest.CopyConfig(env().Config)
	cfg.Wrap(log.wrap)
	c, err := slotcache.New(cfg, slotcache.Options{
		Ring:    ring,
		Count:   count,
		Objects: []client.Object{&corev1.ConfigMap{}},
		Cache:   cache.Options{Scheme: env().Scheme, DefaultNamespaces: map[string]cache.Config{ns: {}}},
	})
	g.Expect(err).NotTo(HaveOccurred())
	ctx := start(t, c)
	ev := newEvents()
	inf, err := c.GetInformer(ctx, &corev1.ConfigMap{})
	g.Expect(err).NotTo(HaveOccurred())
	_, err = inf.AddEventHandler(ev)
	g.Expect(err).NotTo(HaveOccurred())
	// A metadata-only informer of the same kind lists in a batch of its own.
	meta := &metav1.PartialObjectMetadata{}
	meta.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("ConfigMap"))
	metaEv := newEvents()
	metaInf, err := c.GetInformer(ctx, meta)
	g.Expect(err).NotTo(HaveOccurred())
	_, err = metaInf.AddEventHandler(metaEv)
	g.Expect(err).NotTo(HaveOccurred())

	selectors := func(watch bool) []string {
		var out []string
		for _, u := range log.all() {
			parsed, err := url.Parse(u)
			g.Expect(err).NotTo(HaveOccurred())
			if q := parsed.Query(); (q.Get("watch") == "true") == watch {
				out = append(out, q.Get("labelSelector"))
			}
		}
		return out
	}
	label := v1alpha1.SlotLabel(ring)
	// Slots 0 and 1 (group 0), 5 (group 1) and 9 (group 2).
	g.Expect(c.SetSlots(ctx, []int{0, 1, 5, 9})).To(Succeed())
	g.Expect(c.Groups()).To(Equal([]int{0, 1, 2}))
	g.Expect(names(ctx, c, ns)).To(Equal([]string{"s0", "s1", "s5", "s9"}))
	g.Expect(selectors(false)).To(Equal([]string{label + " in (0,1,5,9)", label + " in (0,1,5,9)"}),
		"one LIST for the three groups, per form")
	g.Eventually(func() []string { return selectors(true) }).Should(ConsistOf(
		label+" in (0,1)", label+" in (5)", label+" in (9)",
		label+" in (0,1)", label+" in (5)", label+" in (9)"), "a watch per group and form")
	for _, name := range []string{"s0", "s1", "s5", "s9"} {
		g.Eventually(func() int { return ev.count("add", name) }).Should(Equal(1), name)
		g.Eventually(func() int { return metaEv.count("add", name) }).Should(Equal(1), name)
	}
	metaList := &metav1.PartialObjectMetadataList{}
	metaList.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("ConfigMapList"))
	g.Expect(c.List(ctx, metaList, client.InNamespace(ns))).To(Succeed())
	g.Expect(metaList.Items).To(HaveLen(4))
	for _, item := range metaList.Items {
		g.Expect(item.GroupVersionKind()).To(Equal(corev1.SchemeGroupVersion.WithKind("ConfigMap")))
	}
	// Each group's watch goes on from the list: a change after it reaches
	// the handler.
	createConfigMap(t, ns, "s5b", 5)
	g.Eventually(func() int { return ev.count("add", "s5b") }).Should(Equal(1))

	// Group 3 alone lists itself.
	g.Expect(c.SetSlots(ctx, []int{0, 1, 5, 9, 13})).To(Succeed())
	g.Expect(selectors(false)).To(Equal([]string{label + " in (0,1,5,9)", label + " in (0,1,5,9)", label + " in (13)", label + " in (13)"}))
	g.Expect(names(ctx, c, ns)).To(Equal([]string{"s0", "s1", "s13", "s5", "s5b", "s9"}))
}

// TestGrantedSlotsListConsistently: the first LIST of a newly granted slot,
// in a batch or alone, is a consistent read (no resourceVersion), never a
// read of the API server's watch cache at any age (resourceVersion "0"): the
// old holder of the slot wrote its objects before it acknowledged the
// release, and a list older than those writes would start the new holder on
// states the old one already moved past.
func TestGrantedSlotsListConsistently(t *testing.T) {
	for _, tc := range []struct {
		name       string
		namespaces int
	}{{"in a batch", 1}, {"alone", 2}} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			namespaces := map[string]cache.Config{}
			var ns string
			for range tc.namespaces {
				ns = env().Namespace(t)
				namespaces[ns] = cache.Config{}
			}
			createConfigMap(t, ns, "s0", 0)
			createConfigMap(t, ns, "s5", 5)
			var log requestLog
			cfg := rest.CopyConfig(env().Config)
			cfg.Wrap(log.wrap)
			c, err := slotcache.New(cfg, slotcache.Options{
				Ring:    ring,
				Count:   count,
				Objects: []client.Object{&corev1.ConfigMap{}},
				Cache:   cache.Options{Scheme: env().Scheme, DefaultNamespaces: namespaces},
			})
			g.Expect(err).NotTo(HaveOccurred())
			ctx := start(t, c)
			g.Expect(c.SetSlots(ctx, []int{0, 5})).To(Succeed())
			g.Expect(names(ctx, c, ns)).To(Equal([]string{"s0", "s5"}))
			lists := 0
			for _, u := range log.all() {
				parsed, err := url.Parse(u)
				g.Expect(err).NotTo(HaveOccurred())
				if q := parsed.Query(); q.Get("watch") != "true" {
					lists++
					g.Expect(q.Has("resourceVersion")).To(BeFalse(), "a LIST of granted slots from the watch cache at any age: %s", u)
				}
			}
			g.Expect(lists).To(BeNumerically(">=", 1))
		})
	}
}
