package webhook_test

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/ring"
	"github.com/sharder-dev/sharder/pkg/sharder/webhook"
)

// TestUnknownAlgorithmIsAFault: the webhook cannot compute the instance of
// a new object of a ring whose algorithm this sharder was not built with.
// That is a fault, so the ring's failure policy decides: Fail rejects the
// request naming the algorithm, Ignore lets it through with a warning. The
// webhook keeps answering: other requests are still decided.
func TestUnknownAlgorithmIsAFault(t *testing.T) {
	ctx := context.Background()
	g := NewWithT(t)
	ns := env().Namespace(t)
	const algorithm = "not-built-in"
	g.Expect(ring.Registered(algorithm)).To(BeFalse())
	withPolicy := func(p admissionregistrationv1.FailurePolicyType) func(*v1alpha1.ControllerRing) {
		return func(r *v1alpha1.ControllerRing) {
			r.Spec.Algorithm = algorithm
			r.Spec.Webhook = &v1alpha1.RingWebhook{FailurePolicy: ptr.To(p)}
		}
	}
	failing := createRing(t, ns, withPolicy(admissionregistrationv1.Fail))
	ignoring := createRing(t, ns, withPolicy(admissionregistrationv1.Ignore))
	startSharder(t, webhook.Options{})
	waitProtected(t, failing.Name, ns)
	waitProtected(t, ignoring.Name, ns)

	cfg := configAs(t, userAlice)
	collected := &warnings{}
	cfg.WarningHandler = collected
	alice, err := kubernetes.NewForConfig(cfg)
	g.Expect(err).NotTo(HaveOccurred())

	// A new object carrying a shard label is checked against the ring's
	// choice, which needs the ring's algorithm.
	_, err = alice.CoreV1().ConfigMaps(ns).Create(ctx,
		labelled(ns, "under-fail", map[string]string{v1alpha1.ShardLabel(failing.Name): "inst-a"}), metav1.CreateOptions{})
	g.Expect(err).To(HaveOccurred())
	g.Expect(err.Error()).To(And(ContainSubstring(`cannot check labels of ring "`+failing.Name+`"`), ContainSubstring(`"`+algorithm+`"`)))

	_, err = alice.CoreV1().ConfigMaps(ns).Create(ctx,
		labelled(ns, "under-ignore", map[string]string{v1alpha1.ShardLabel(ignoring.Name): "inst-a"}), metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(collected.all()).To(ContainElement(And(ContainSubstring(`ring "`+ignoring.Name+`"`), ContainSubstring(`"`+algorithm+`"`))))

	// Decisions that do not need the algorithm are still made.
	waitProtected(t, failing.Name, ns)
	waitProtected(t, ignoring.Name, ns)
}
