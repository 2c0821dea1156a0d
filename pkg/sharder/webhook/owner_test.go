package webhook_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/sharder-dev/sharder/pkg/sharder/webhook"
)

// TestConfigurationOwnedByClusterRole: the configuration carries an
// ownerReference to the install's ClusterRole, so that garbage collection
// removes it with the install; the mutating configuration of rings in
// admission mode has the same owner. (The test's API server runs no garbage
// collector: the reference itself is what is checked.) An owner that does
// not exist yet is picked up once it does.
func TestConfigurationOwnedByClusterRole(t *testing.T) {
	ctx := context.Background()
	g := NewWithT(t)
	ns := env().Namespace(t)
	owner := "sharder-owner-" + rand.String(5)
	s := startSharder(t, webhook.Options{OwnerClusterRole: owner})
	createRing(t, ns, admissionMode(ns)) // so that there is a mutating configuration too

	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	get := func(g Gomega) {
		g.Expect(env().Client.Get(ctx, types.NamespacedName{Name: s.opts.ConfigurationName}, cfg)).To(Succeed())
	}
	g.Eventually(get).Should(Succeed())
	g.Expect(cfg.OwnerReferences).To(BeEmpty(), "no owner while the ClusterRole does not exist")

	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: owner}}
	g.Expect(env().Client.Create(ctx, role)).To(Succeed())
	t.Cleanup(func() { _ = env().Client.Delete(context.Background(), role) })
	g.Eventually(func(g Gomega) {
		get(g)
		g.Expect(cfg.OwnerReferences).To(Equal([]metav1.OwnerReference{{
			APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole", Name: owner, UID: role.UID,
		}}))
		mutating := &admissionregistrationv1.MutatingWebhookConfiguration{}
		g.Expect(env().Client.Get(ctx, types.NamespacedName{Name: s.opts.ConfigurationName}, mutating)).To(Succeed())
		g.Expect(mutating.OwnerReferences).To(Equal(cfg.OwnerReferences))
	}).WithTimeout(30 * time.Second).Should(Succeed())
}
