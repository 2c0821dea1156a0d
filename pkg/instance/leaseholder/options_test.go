package leaseholder_test

import (
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/sharder-dev/sharder/pkg/instance/leaseholder"
	"github.com/sharder-dev/sharder/pkg/membership"
)

// TestHolderOptions checks that NewHolder refuses options that break their
// rules with an error naming the option, and fills in the defaults.
func TestHolderOptions(t *testing.T) {
	valid := func() leaseholder.Options {
		return leaseholder.Options{Ring: "r", Namespace: "ns", Identity: "i-0"}
	}
	// Each case names the option its error must name.
	for _, tc := range []struct {
		name   string
		field  string
		mutate func(*leaseholder.Options)
	}{
		{"no ring", "ring", func(o *leaseholder.Options) { o.Ring = "" }},
		{"ring not a DNS label", "ring", func(o *leaseholder.Options) { o.Ring = "Ring.One" }},
		{"no namespace", "lease namespace", func(o *leaseholder.Options) { o.Namespace = "" }},
		{"identity not a Lease name", "instance ID", func(o *leaseholder.Options) { o.Identity = "Instance_0" }},
		{"identity too long for a label value", "instance ID", func(o *leaseholder.Options) { o.Identity = strings.Repeat("i", 64) }},
		{"default identity too long for a label value", "instance ID", func(o *leaseholder.Options) {
			o.Identity = ""
			t.Setenv("POD_NAME", "pod."+strings.Repeat("p", 60))
		}},
		{"negative weight", "virtual nodes", func(o *leaseholder.Options) { o.VirtualNodes = -1 }},
		{"weight above the maximum", "virtual nodes", func(o *leaseholder.Options) { o.VirtualNodes = membership.MaxVirtualNodes + 1 }},
		{"fractional duration", "lease duration", func(o *leaseholder.Options) { o.LeaseDuration = 1500 * time.Millisecond }},
		{"duration below a second", "lease duration", func(o *leaseholder.Options) { o.LeaseDuration = 500 * time.Millisecond }},
		{"renew period not below the duration", "renew period", func(o *leaseholder.Options) {
			o.LeaseDuration = 2 * time.Second
			o.RenewPeriod = 2 * time.Second
		}},
		{"renew period not below the deadline", "renew period", func(o *leaseholder.Options) {
			o.RenewPeriod = 10 * time.Second
			o.RenewDeadline = 10 * time.Second
		}},
		{"renew period not below the default deadline", "renew period", func(o *leaseholder.Options) { o.RenewPeriod = 11 * time.Second }},
		{"renew deadline not below the duration", "renew deadline", func(o *leaseholder.Options) { o.RenewDeadline = 15 * time.Second }},
		{"negative renew deadline", "renew deadline", func(o *leaseholder.Options) { o.RenewDeadline = -time.Second }},
		{"default renew period above the duration given", "renew period", func(o *leaseholder.Options) { o.RenewPeriod = 20 * time.Second }},
		{"negative shutdown timeout", "shutdown timeout", func(o *leaseholder.Options) { o.ShutdownTimeout = -time.Second }},
		{"unknown release", "release", func(o *leaseholder.Options) { o.Release = "Pause" }},
		{"max watch lag not above the renew period", "max watch lag", func(o *leaseholder.Options) { o.MaxWatchLag = 5 * time.Second }},
		{"negative max watch lag", "max watch lag", func(o *leaseholder.Options) { o.MaxWatchLag = -time.Second }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := valid()
			tc.mutate(&opts)
			_, err := leaseholder.NewHolder(env().Client, opts)
			NewWithT(t).Expect(err).To(MatchError(ContainSubstring(tc.field)))
		})
	}

	t.Run("defaults", func(t *testing.T) {
		g := NewWithT(t)
		t.Setenv("POD_NAME", "pod-7")
		h, err := leaseholder.NewHolder(env().Client, leaseholder.Options{Ring: "r", Namespace: "ns"})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(h.Identity()).To(Equal("pod-7"))
		g.Expect(h.NeedLeaderElection()).To(BeFalse())
		g.Expect(h.Held()).To(BeFalse())
		id, err := membership.DefaultIdentity()
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(id).To(Equal("pod-7"))
	})
}

func TestValidateIdentity(t *testing.T) {
	for _, id := range []string{"pod-0", "etcd-operator.2", strings.Repeat("i", 63)} {
		t.Run("valid "+id, func(t *testing.T) {
			NewWithT(t).Expect(leaseholder.ValidateIdentity(id)).To(Succeed())
		})
	}
	for name, id := range map[string]string{
		"empty":                  "",
		"64 characters":          strings.Repeat("i", 64),
		"upper case":             "Pod-0",
		"underscore":             "pod_0",
		"leading dash":           "-pod",
		"trailing dot":           "pod.",
		"a Lease name only":      "pod-0." + strings.Repeat("x", 60),
		"a label value only":     "Pod_0",
		"slash (neither of two)": "ns/pod",
	} {
		t.Run(name, func(t *testing.T) {
			err := leaseholder.ValidateIdentity(id)
			NewWithT(t).Expect(err).To(MatchError(And(ContainSubstring("instance ID %q", id), ContainSubstring("POD_NAME"))))
		})
	}
}
