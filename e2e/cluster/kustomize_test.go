package cluster

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// kustomizeNamespace is where config/default installs the sharder.
const kustomizeNamespace = "sharder-system"

// TestKustomizeInstall installs the sharder as the getting-started guide's
// second path says, `kubectl apply -k config/default`, checks that its
// replicas become Ready and that its webhook guards the ring TestSharderChart
// left declared, deletes that ring (the running sharder removes its labels
// first), then removes the install with `kubectl delete -k config/default`
// and checks that nothing of it is left to refuse later writes: its webhook
// configuration, owned by its ClusterRole, goes with it.
func TestKustomizeInstall(t *testing.T) {
	g := NewWithT(t)
	ctx := t.Context()
	install := filepath.Join(repoRoot, "config", "default")

	// The ring of TestSharderChart: declared again if that test did not run.
	if err := k8sClient.Get(ctx, client.ObjectKey{Name: ring}, &sharderv1alpha1.ControllerRing{}); apierrors.IsNotFound(err) {
		createRing(ctx, g)
	}
	t.Cleanup(func() {
		if t.Failed() {
			dumpState(t, kustomizeNamespace, "app.kubernetes.io/name=sharder")
		}
	})

	By(t, "kubectl apply -k config/default: the replicas become Ready")
	out, err := kubectl(ctx, "apply", "-k", install)
	g.Expect(err).NotTo(HaveOccurred(), out)
	out, err = kubectl(ctx, "rollout", "status", "deployment/sharder", "--namespace", kustomizeNamespace, "--timeout", "3m")
	g.Expect(err).NotTo(HaveOccurred(), out)

	By(t, "the webhook guards the ring's labels")
	// The leader writes the webhook configuration once it runs the ring.
	g.Eventually(func(g Gomega) {
		var conf admissionregistrationv1.ValidatingWebhookConfiguration
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Name: "sharder"}, &conf)).To(Succeed())
		g.Expect(conf.Webhooks).To(ContainElement(HaveField("Name", ring+".shard-label.sharder.dev")))
		g.Expect(conf.OwnerReferences).To(ContainElement(HaveField("Kind", "ClusterRole")), "owned by the install's ClusterRole")
	}).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: objectsNamespace, Name: "kustomize"}}
	g.Expect(client.IgnoreAlreadyExists(k8sClient.Create(ctx, cm))).To(Succeed())
	setShard := func(value string) error {
		patch := []byte(`{"metadata":{"labels":{"` + sharderv1alpha1.ShardLabel(ring) + `":"` + value + `"}}}`)
		return k8sClient.Patch(ctx, cm, client.RawPatch("application/merge-patch+json", patch))
	}
	// The object carries no shard label yet (the ring has no instance), so
	// the webhook for objects without one answers: an admin may not set it.
	g.Eventually(func() error {
		err := setShard("by-hand")
		switch {
		case err == nil:
			return StopTrying("an admin set the shard label by hand: the webhook allowed it")
		case strings.Contains(err.Error(), "denied the request"):
			return nil
		default:
			return err // not answered yet (the ring fails closed)
		}
	}).WithTimeout(2 * time.Minute).WithPolling(2 * time.Second).Should(Succeed())

	By(t, "the rings, deleted while the sharder runs, go once the sharder removed their labels")
	// As docs/operations.md says to remove the sharder: rings first, every
	// one (those the chart's uninstall left terminating too). A ring's
	// finalizer keeps it until a sharder removed its labels; a ring left
	// when the install goes (its ClusterRole gone) would keep the CRD
	// terminating.
	out, err = kubectl(ctx, "delete", "controllerrings", "--all", "--wait", "--timeout", "2m")
	g.Expect(err).NotTo(HaveOccurred(), out)

	By(t, "kubectl delete -k config/default leaves nothing that refuses writes")
	// As a user removes it: the CRD goes too.
	out, err = kubectl(ctx, "delete", "-k", install, "--wait", "--timeout", "3m", "--ignore-not-found")
	g.Expect(err).NotTo(HaveOccurred(), out)
	g.Eventually(func(g Gomega) {
		g.Expect(podNames(ctx, g, kustomizeNamespace, "app.kubernetes.io/name=sharder")).To(BeEmpty())
		err := k8sClient.Get(ctx, client.ObjectKey{Name: "sharder"}, &admissionregistrationv1.ValidatingWebhookConfiguration{})
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the webhook configuration is left behind (get: %v)", err)
	}).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
	g.Expect(setShard("after-uninstall")).To(Succeed(), "a label change after the uninstall")
}
