package webhook_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/sharder/webhook"
)

// TestAdmissionFollowsMembershipChanges changes the membership of a ring in
// admission mode under the assigning webhook, which builds its rings from
// the Leases as its watch delivers them: an instance that releases its
// Lease, one whose Lease is deleted, and one that joins. Once the webhook's
// watch has had a moment to deliver a change, no create is labelled for an
// instance that is not ready, and the joining instance gets the objects the
// ring picks for it.
func TestAdmissionFollowsMembershipChanges(t *testing.T) {
	ctx := context.Background()
	g := NewWithT(t)
	ns := env().Namespace(t)
	r := createRing(t, ns, admissionMode(ns))
	shard := v1alpha1.ShardLabel(r.Name)
	sharderClient := clientAs(t, sharderUser)
	for _, id := range []string{"inst-a", "inst-b"} {
		createLease(t, sharderClient, ns, r.Name, id, time.Now(), time.Hour)
	}
	startSharder(t, webhook.Options{})
	alice := clientAs(t, userAlice)
	waitAssigning(t, alice, r.Name, ns)

	n := 0
	create := func() (string, string) {
		n++
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%d", n), Namespace: ns}}
		g.Expect(alice.Create(ctx, cm)).To(Succeed())
		return cm.Name, cm.Labels[shard]
	}
	// settle gives the webhook's watch time to deliver a write (it takes
	// milliseconds; the margin is for a loaded machine).
	settle := func() { time.Sleep(time.Second) }
	expectOnly := func(ready ...string) {
		for range 20 {
			name, got := create()
			g.Expect(got).To(Equal(instanceOf(t, ready, ns, name)), "%s, ready: %v", name, ready)
		}
	}
	expectOnly("inst-a", "inst-b")

	// inst-b releases its Lease: it is dead, never chosen again.
	lease := &coordinationv1.Lease{}
	g.Expect(sharderClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: "inst-b"}, lease)).To(Succeed())
	lease.Spec.HolderIdentity = ptr.To("")
	g.Expect(sharderClient.Update(ctx, lease)).To(Succeed())
	settle()
	expectOnly("inst-a")

	// inst-c joins: the objects its ring picks for it go to it once its
	// ring is built, the others stay on inst-a meanwhile.
	createLease(t, sharderClient, ns, r.Name, "inst-c", time.Now(), time.Hour)
	g.Eventually(func(g Gomega) {
		name, got := create()
		g.Expect(got).To(Equal("inst-c"), name)
	}, 30*time.Second, 10*time.Millisecond).Should(Succeed())
	expectOnly("inst-a", "inst-c")

	// inst-a's Lease is deleted: it has vanished, and is not ready.
	g.Expect(sharderClient.Delete(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "inst-a"}})).To(Succeed())
	settle()
	expectOnly("inst-c")
}
