package leaseholder_test

import (
	"context"
	"errors"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/utils/ptr"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/instance/leaseholder"
)

// TestAnnotate: Annotate is refused before the Lease is held; once held it
// renews at once with the annotation (a renewal brought forward, locked on
// the resourceVersion), the next renewal comes a renew period later and
// keeps it, and a second call replaces the value.
func TestAnnotate(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ns := env().Namespace(t)
	key := v1alpha1.AnnotationSlotsAcknowledged
	// Released: acquired at once.
	createLease(t, holderRing, ns, "annotated", time.Now().Add(-time.Minute), 30, func(l *coordinationv1.Lease) {
		l.Spec.HolderIdentity = ptr.To("")
	})
	// A long renew period: any renewal seen within it was brought forward.
	r := startHolder(t, leaseholder.Options{
		Ring: holderRing, Namespace: ns, Identity: "annotated",
		LeaseDuration: 30 * time.Second, RenewPeriod: 5 * time.Second,
	})
	g.Expect(r.Annotate(context.Background(), key, "too-early")).To(MatchError(leaseholder.ErrNotHeld))
	g.Eventually(r.Held).Should(BeTrue())
	before, err := getLease(ns, "annotated")()
	g.Expect(err).NotTo(HaveOccurred())

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	g.Expect(r.Annotate(ctx, key, "uid/3")).To(Succeed())
	g.Expect(time.Since(start)).To(BeNumerically("<", 4*time.Second), "renewed at once, not at the next renew period")
	after, err := getLease(ns, "annotated")()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(after.Annotations).To(HaveKeyWithValue(key, "uid/3"))
	g.Expect(after.Annotations).NotTo(HaveKey(v1alpha1.AnnotationRestarting))
	g.Expect(after.Spec.RenewTime.Time).To(BeTemporally(">", before.Spec.RenewTime.Time), "the annotation comes with a renewal")
	g.Expect(after.ResourceVersion).NotTo(Equal(before.ResourceVersion))

	// The next renewal is due a renew period after the one brought forward,
	// and keeps the annotation.
	g.Consistently(getLease(ns, "annotated"), 3*time.Second, 100*time.Millisecond).
		Should(HaveField("Spec.RenewTime.Time", BeTemporally("==", after.Spec.RenewTime.Time)))
	g.Eventually(getLease(ns, "annotated"), 10*time.Second).
		Should(HaveField("Spec.RenewTime.Time", BeTemporally(">", after.Spec.RenewTime.Time)))
	renewed, err := getLease(ns, "annotated")()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(renewed.Annotations).To(HaveKeyWithValue(key, "uid/3"))

	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	g.Expect(r.Annotate(ctx, key, "uid/4")).To(Succeed())
	g.Expect(getLease(ns, "annotated")()).To(HaveField("Annotations", HaveKeyWithValue(key, "uid/4")))

	// Stopped: the Lease is released with the annotation, and Annotate is
	// refused.
	r.cancel()
	g.Eventually(getLease(ns, "annotated")).Should(HaveField("Spec.HolderIdentity", HaveValue(BeEmpty())))
	g.Expect(getLease(ns, "annotated")()).To(HaveField("Annotations", HaveKeyWithValue(key, "uid/4")))
	err = r.Annotate(ctx, key, "uid/5")
	g.Expect(errors.Is(err, leaseholder.ErrNotHeld)).To(BeTrue(), "got %v", err)
}
