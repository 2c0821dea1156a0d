package slottable_test

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/sharder-dev/sharder/internal/fixture"
	"github.com/sharder-dev/sharder/internal/testenv"
	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/sharder/slottable"
	"github.com/sharder-dev/sharder/pkg/sharder/webhook"
	"github.com/sharder-dev/sharder/pkg/slots"
)

// startWebhook runs the sharder's webhook (as `sharder run` does, with its
// own configuration in URL mode and self-managed certificates kept in
// namespace) until the test ends, and waits until the API server sends it
// ring's table writes: a dry-run write taking a slot from a holder that
// holds its Lease is denied.
func startWebhook(t *testing.T, ring *v1alpha1.ControllerRing, namespace string) {
	t.Helper()
	g := NewWithT(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	g.Expect(err).NotTo(HaveOccurred())
	port := l.Addr().(*net.TCPAddr).Port
	g.Expect(l.Close()).To(Succeed())
	opts := webhook.Options{ConfigurationName: "slottable-test-" + rand.String(5), SecretName: "webhook-tls", Namespace: namespace,
		URL: "https://127.0.0.1:" + strconv.Itoa(port), ResyncPeriod: 5 * time.Second}
	mgrOpts := env().ManagerOptions()
	mgrOpts.WebhookServer = ctrlwebhook.NewServer(ctrlwebhook.Options{Host: "127.0.0.1", Port: port})
	mgr := env().NewManager(t, env().Config, mgrOpts)
	g.Expect(webhook.Setup(mgr, opts)).To(Succeed())
	testenv.StartManager(t, mgr)
	t.Cleanup(func() {
		err := env().Client.Delete(context.Background(), &admissionregistrationv1.ValidatingWebhookConfiguration{
			ObjectMeta: metav1.ObjectMeta{Name: opts.ConfigurationName}})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting the webhook configuration: %v", err)
		}
	})

	g.Eventually(func(g Gomega) {
		r, err := getRing(ring.Name)
		g.Expect(err).NotTo(HaveOccurred())
		table, err := slots.FromStatus(int(ring.Spec.Assignment.Slots.Count), r.Status.Slots)
		g.Expect(err).NotTo(HaveOccurred())
		var from, to string
		for _, s := range table.Slots {
			if s.Holder != "" && !s.Releasing && from == "" {
				from = s.Holder
			}
		}
		for _, s := range table.Slots {
			if s.Holder != "" && s.Holder != from {
				to = s.Holder
			}
		}
		g.Expect(from).NotTo(BeEmpty())
		g.Expect(to).NotTo(BeEmpty())
		next := table.Clone()
		next.Revision++
		for i, s := range next.Slots {
			if s.Holder == from {
				next.Slots[i] = slots.Slot{Holder: to}
				break
			}
		}
		updated := r.DeepCopy()
		updated.Status.Slots = next.Status()
		err = env().Client.Status().Patch(context.Background(), updated, client.MergeFrom(r), client.DryRunAll)
		g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "the webhook does not check the table yet: %v", err)
	}).WithTimeout(30 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())
}

// TestPausedSharderGrantsNothingOfABackInstance: the sharder decides to
// grant a dead instance's slots away under its hold of the instance's
// Lease, and is paused before the write goes out (here: the write is held
// back in the sharder's transport); meanwhile the instance acquires its
// Lease again. The write, which the ring's resourceVersion alone would let
// through, is denied at admission; the sharder decides again and the
// instance keeps its slots, never losing one without a release while it
// holds its Lease.
func TestPausedSharderGrantsNothingOfABackInstance(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ring, ns := newRing(t, 64)
	createLease(t, ring.Name, ns, "a", 60)
	createLease(t, ring.Name, ns, "b", 60)
	createLease(t, ring.Name, ns, "c", 60)
	s := startSharder(t, ring.Name, ns, slottable.Options{})
	g.Eventually(tableOf(ring)).Should(Satisfy(balanced("a", "b", "c")))
	startWebhook(t, ring, ns)
	before := must(tableOf(ring)())
	cSlots, _ := before.HeldBy("c")
	failed := s.failed()

	// c stops and releases its Lease; the sharder takes its hold and
	// decides to grant c's slots to a and b. Before that write leaves, c is
	// back and holds its Lease (as it does once a paused sharder's hold
	// lapsed).
	back := make(chan struct{})
	s.interfereOnce(func() {
		defer close(back)
		g.Eventually(fixture.GetLease(env().Client, ns, "c")).Should(HaveField("Spec.HolderIdentity", Equal(ptr.To(sharderIdentity))),
			"the sharder holds c's Lease while it grants c's slots away")
		updateLease(g, ns, "c", func(l *coordinationv1.Lease) {
			now := metav1.NewMicroTime(time.Now())
			l.Spec.HolderIdentity, l.Spec.AcquireTime, l.Spec.RenewTime = ptr.To("c"), &now, &now
			l.Spec.LeaseDurationSeconds = ptr.To[int32](60)
		})
	})
	updateLease(g, ns, "c", fixture.Released)
	g.Eventually(back, 30*time.Second).Should(BeClosed())

	// The late write was denied; c keeps every slot it held, while the
	// sharder decides again on what it sees now.
	g.Eventually(s.failed, 10*time.Second).Should(BeNumerically(">", failed), "the late table write was not refused")
	g.Consistently(func(g Gomega) {
		table, err := tableOf(ring)()
		g.Expect(err).NotTo(HaveOccurred())
		granted, _ := table.HeldBy("c")
		g.Expect(granted).To(Equal(cSlots), "c lost slots while it held its Lease")
	}, 3*time.Second, 100*time.Millisecond).Should(Succeed())
}
