package webhook_test

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/sharder/webhook"
)

// clientAsPod returns a client for user with a credential bound to pod, as
// the API server authenticates a projected ServiceAccount token: the pod's
// name is in the user's extra authentication.kubernetes.io/pod-name.
func clientAsPod(t testing.TB, user, pod string) client.Client {
	t.Helper()
	cfg := configAs(t, user)
	cfg.Impersonate.Extra = map[string][]string{serviceaccount.PodNameKey: {pod}}
	c, err := client.New(cfg, client.Options{Scheme: env().Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestDrainAcknowledgedOnlyByTheInstancePod: a credential bound to a pod
// acknowledges only drains of objects assigned to that pod's instance.
func TestDrainAcknowledgedOnlyByTheInstancePod(t *testing.T) {
	ctx := context.Background()
	ns := env().Namespace(t)
	// A second instance service account, running in the Lease namespace.
	nsInstanceUser := serviceaccount.MakeUsername(ns, "instance")
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "webhook-test-" + ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: nsInstanceUser}},
	}
	if err := env().Client.Create(ctx, binding); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env().Client.Delete(context.Background(), binding) })
	r := createRing(t, ns, func(r *v1alpha1.ControllerRing) {
		r.Spec.InstanceServiceAccounts = append(r.Spec.InstanceServiceAccounts, v1alpha1.ServiceAccountReference{Namespace: ns, Name: "instance"})
	})
	startSharder(t, webhook.Options{})
	waitProtected(t, r.Name, ns)
	shard, drain := v1alpha1.ShardLabel(r.Name), v1alpha1.DrainLabel(r.Name)
	sh := clientAs(t, sharderUser)
	ack := func(l map[string]string) { delete(l, shard); delete(l, drain) }
	draining := func(g Gomega, name, instance string) *corev1.ConfigMap {
		cm := labelled(ns, name, map[string]string{shard: instance, drain: "true"})
		g.Expect(sh.Create(ctx, cm)).To(Succeed())
		return cm
	}

	t.Run("by default the instance's pod is the pod named like the instance", func(t *testing.T) {
		g := NewWithT(t)
		cm := draining(g, "default-id", "inst-a")
		expectDenied(g, relabel(clientAsPod(t, instanceUser, "inst-b"), cm, ack),
			`instance "inst-a"`, "the request came from pod "+instanceNS+"/inst-b")
		g.Expect(relabel(clientAsPod(t, instanceUser, "inst-a"), cm, ack)).To(Succeed())
		g.Expect(sh.Get(ctx, client.ObjectKeyFromObject(cm), cm)).To(Succeed())
		g.Expect(cm.Labels).NotTo(HaveKey(shard))
		g.Expect(cm.Labels).NotTo(HaveKey(drain))
	})

	t.Run("an instance whose Lease names its Pod as owner acknowledges from that pod", func(t *testing.T) {
		g := NewWithT(t)
		lease := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: "inst-c", Namespace: ns, Labels: map[string]string{v1alpha1.LabelRing: r.Name},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "operator-7d9f", UID: types.UID("pod-uid")}}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("inst-c"), LeaseDurationSeconds: ptr.To[int32](15)},
		}
		g.Expect(sh.Create(ctx, lease)).To(Succeed())
		cm := draining(g, "lease-owner", "inst-c")
		// The webhook reads Leases from its cache: wait until it knows the owner.
		g.Eventually(func() error {
			return relabel(clientAsPod(t, nsInstanceUser, "operator-7d9f"), cm, ack, client.DryRunAll)
		}).Should(Succeed())
		expectDenied(g, relabel(clientAsPod(t, nsInstanceUser, "inst-c"), cm, ack), "pod "+ns+"/operator-7d9f (the owner of its Lease)")
		// The same pod name in another namespace is another pod.
		expectDenied(g, relabel(clientAsPod(t, instanceUser, "operator-7d9f"), cm, ack), `instance "inst-c"`)
		g.Expect(relabel(clientAsPod(t, nsInstanceUser, "operator-7d9f"), cm, ack)).To(Succeed())
	})

	t.Run("a hand-over to the drain's target comes from the pod of the instance holding the object", func(t *testing.T) {
		g := NewWithT(t)
		cm := labelled(ns, "hand-over", map[string]string{shard: "inst-a", drain: "inst-b"})
		g.Expect(sh.Create(ctx, cm)).To(Succeed())
		handOver := func(l map[string]string) { l[shard] = "inst-b"; delete(l, drain) }
		expectDenied(g, relabel(clientAsPod(t, instanceUser, "inst-b"), cm, handOver), `instance "inst-a"`)
		g.Expect(relabel(clientAsPod(t, instanceUser, "inst-a"), cm, handOver)).To(Succeed())
		g.Expect(sh.Get(ctx, client.ObjectKeyFromObject(cm), cm)).To(Succeed())
		g.Expect(cm.Labels).To(HaveKeyWithValue(shard, "inst-b"))
		g.Expect(cm.Labels).NotTo(HaveKey(drain))
	})

	t.Run("a credential not bound to a pod keeps the service account rule", func(t *testing.T) {
		g := NewWithT(t)
		cm := draining(g, "unbound", "inst-a")
		g.Expect(relabel(clientAs(t, instanceUser), cm, ack)).To(Succeed())
	})
}
