package instance

import (
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/pkg/instance/leaseholder"
)

func TestSelector(t *testing.T) {
	g := NewWithT(t)
	s := Selector("web", "web-0")
	g.Expect(s.String()).To(Equal("shard.sharder.dev/web=web-0"))
	for _, tc := range []struct {
		labels map[string]string
		match  bool
	}{
		{map[string]string{"shard.sharder.dev/web": "web-0"}, true},
		{map[string]string{"shard.sharder.dev/web": "web-0", "drain.sharder.dev/web": "true"}, true},
		{map[string]string{"shard.sharder.dev/web": "web-1"}, false},
		{map[string]string{"shard.sharder.dev/api": "web-0"}, false},
		{nil, false},
	} {
		g.Expect(s.Matches(labels.Set(tc.labels))).To(Equal(tc.match), "%v", tc.labels)
	}
}

func TestSelectByShard(t *testing.T) {
	g := NewWithT(t)
	cm, secret := &corev1.ConfigMap{}, &corev1.Secret{}
	byObject, err := selectByShard(cache.Options{}, "web", "web-0", []client.Object{cm, secret})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(byObject).To(HaveLen(2))
	for _, obj := range []client.Object{cm, secret} {
		g.Expect(byObject[obj].Label.String()).To(Equal("shard.sharder.dev/web=web-0"))
	}

	// An entry of the manager's options for a ring kind keeps its settings,
	// its selector ANDed with the instance's.
	own := &corev1.ConfigMap{}
	byObject, err = selectByShard(cache.Options{ByObject: map[client.Object]cache.ByObject{
		own: {Label: labels.SelectorFromSet(labels.Set{"team": "a"}), UnsafeDisableDeepCopy: ptr.To(true)},
	}}, "web", "web-0", []client.Object{cm})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(byObject).To(HaveLen(1))
	g.Expect(byObject[own].Label.String()).To(Equal("shard.sharder.dev/web=web-0,team=a"))
	g.Expect(byObject[own].UnsafeDisableDeepCopy).To(HaveValue(BeTrue()))
}

func TestTweakListOptions(t *testing.T) {
	g := NewWithT(t)
	tweak := TweakListOptions("web", "web-0")

	opts := metav1.ListOptions{}
	tweak(&opts)
	g.Expect(opts.LabelSelector).To(Equal("shard.sharder.dev/web=web-0"))

	opts = metav1.ListOptions{LabelSelector: "app=x"}
	tweak(&opts)
	sel, err := labels.Parse(opts.LabelSelector)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(sel.Matches(labels.Set{"app": "x", "shard.sharder.dev/web": "web-0"})).To(BeTrue())
	g.Expect(sel.Matches(labels.Set{"shard.sharder.dev/web": "web-0"})).To(BeFalse(), "the existing selector still applies")
	g.Expect(sel.Matches(labels.Set{"app": "x"})).To(BeFalse())
}

func TestLabelChild(t *testing.T) {
	g := NewWithT(t)
	owner := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{
		"shard.sharder.dev/web": "web-0", "drain.sharder.dev/web": "true", "app": "x"}}}

	child := &corev1.Secret{}
	g.Expect(LabelChild("web", owner, child)).To(BeTrue())
	g.Expect(child.Labels).To(Equal(map[string]string{"shard.sharder.dev/web": "web-0"}), "only the shard label is copied")

	child = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"shard.sharder.dev/web": "stale", "keep": "me"}}}
	g.Expect(LabelChild("web", owner, child)).To(BeTrue())
	g.Expect(child.Labels).To(Equal(map[string]string{"shard.sharder.dev/web": "web-0", "keep": "me"}))

	child = &corev1.Secret{}
	g.Expect(LabelChild("api", owner, child)).To(BeFalse(), "owner is not in that ring")
	g.Expect(child.Labels).To(BeEmpty())

	// Slot mode: the owner's slot label.
	slotOwner := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{
		"slot.sharder.dev/web": "17", "slot.sharder.dev/api": "3", "app": "x"}}}
	child = &corev1.Secret{}
	g.Expect(LabelChild("web", slotOwner, child)).To(BeTrue())
	g.Expect(child.Labels).To(Equal(map[string]string{"slot.sharder.dev/web": "17"}), "only the ring's slot label is copied")
}

func TestOptionsComplete(t *testing.T) {
	valid := Options{Ring: "web", Identity: "web-0", Lease: leaseholder.Options{Namespace: "web-system"}}
	for _, tc := range []struct {
		name   string
		modify func(*Options)
		errSub string
	}{
		{"valid", func(*Options) {}, ""},
		{"no ring", func(o *Options) { o.Ring = "" }, "ring"},
		{"ring not a DNS label", func(o *Options) { o.Ring = "Web_1" }, "ring"},
		{"no lease namespace", func(o *Options) { o.Lease.Namespace = "" }, "lease namespace"},
		{"identity not a label value", func(o *Options) { o.Identity = "a/b" }, `instance ID "a/b"`},
		{"identity too long for a label value", func(o *Options) { o.Identity = "web-" + strings.Repeat("0", 60) }, "63"},
		{"negative virtual nodes", func(o *Options) { o.Lease.VirtualNodes = -1 }, "virtual nodes"},
		{"negative retry period", func(o *Options) { o.RetryPeriod = -1 }, "retry period"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			o := valid
			tc.modify(&o)
			got := o
			err := got.setDefaults()
			if err == nil {
				err = got.validate()
			}
			if tc.errSub != "" {
				g.Expect(err).To(MatchError(ContainSubstring(tc.errSub)))
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(got.RetryPeriod).To(Equal(DefaultRetryPeriod))
			g.Expect(got.Lease.Clock).NotTo(BeNil())
		})
	}
}
