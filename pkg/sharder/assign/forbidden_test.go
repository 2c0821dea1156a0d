package assign_test

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/sharder/assign"
	"github.com/sharder-dev/sharder/pkg/sharder/leasecontroller"
)

// TestForbiddenResourceIsReported runs the sharder as a user that may
// watch and patch ConfigMaps but not Secrets. The ring naming both reports
// ResourceForbidden and still assigns its ConfigMaps.
func TestForbiddenResourceIsReported(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := env().Namespace(t)
	user, err := env().Environment.ControlPlane.AddUser(envtest.User{Name: "sharder-" + ns}, env().Config)
	g.Expect(err).NotTo(HaveOccurred())
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "sharder-" + ns},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"sharder.dev"}, Resources: []string{"controllerrings"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{"sharder.dev"}, Resources: []string{"controllerrings/status"}, Verbs: []string{"get", "patch", "update"}},
			{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
			{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch", "patch"}},
		},
	}
	g.Expect(env().Client.Create(ctx, role)).To(Succeed())
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "sharder-" + ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "sharder-" + ns}},
	}
	g.Expect(env().Client.Create(ctx, binding)).To(Succeed())
	t.Cleanup(func() {
		_ = env().Client.Delete(context.Background(), binding)
		_ = env().Client.Delete(context.Background(), role)
	})

	reg := leasecontroller.NewRegistry()
	reg.Set(ns, members(membership.StateReady, "a"))
	newRing(t, ns, func(s *v1alpha1.ControllerRingSpec) {
		s.Resources[0].ControlledResources = []metav1.GroupResource{{Resource: "secrets"}}
	})
	names := createConfigMaps(t, ns, "cm", 5)
	startSharderWith(t, user.Config(), reg, assign.Options{}, nil)

	g.Eventually(assigned(ns, names, on("a")), timeout, poll).Should(Succeed())
	g.Eventually(func(g Gomega) {
		r := getRing(g, ns)
		cond := meta.FindStatusCondition(r.Status.Conditions, v1alpha1.ConditionReady)
		g.Expect(cond).NotTo(BeNil())
		g.Expect(cond.Status).To(Equal(metav1.ConditionFalse))
		g.Expect(cond.Reason).To(Equal(v1alpha1.ReasonResourceForbidden))
		g.Expect(cond.Message).To(ContainSubstring(`"secrets"`))
	}, timeout, poll).Should(Succeed())
}

// TestRingOfNamedNamespacesNeedsNoClusterWidePermission runs the sharder as
// a user that may list, watch and patch ConfigMaps and Secrets only in the
// ring's namespace (a Role there, no ClusterRole for them). The ring's
// selector names that namespace, so its resources are watched there alone:
// the ring is Ready, its ConfigMaps are assigned and their Secrets follow.
// Watched across the cluster, both lists would be forbidden.
func TestRingOfNamedNamespacesNeedsNoClusterWidePermission(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := env().Namespace(t)
	name := "sharder-" + ns
	user, err := env().Environment.ControlPlane.AddUser(envtest.User{Name: name}, env().Config)
	g.Expect(err).NotTo(HaveOccurred())
	clusterRole := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"sharder.dev"}, Resources: []string{"controllerrings"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{"sharder.dev"}, Resources: []string{"controllerrings/status"}, Verbs: []string{"get", "patch", "update"}},
			{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
			{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"get", "list", "watch"}},
		},
	}
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"configmaps", "secrets"}, Verbs: []string{"get", "list", "watch", "patch"}},
		},
	}
	subjects := []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: name}}
	clusterBinding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   subjects,
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects:   subjects,
	}
	for _, obj := range []client.Object{clusterRole, role, clusterBinding, binding} {
		g.Expect(env().Client.Create(ctx, obj)).To(Succeed())
	}
	t.Cleanup(func() {
		_ = env().Client.Delete(context.Background(), clusterBinding)
		_ = env().Client.Delete(context.Background(), clusterRole)
	})

	reg := leasecontroller.NewRegistry()
	reg.Set(ns, members(membership.StateReady, "a"))
	// newRing's selector names the test's namespace.
	newRing(t, ns, func(s *v1alpha1.ControllerRingSpec) {
		s.Resources[0].ControlledResources = []metav1.GroupResource{{Resource: "secrets"}}
	})
	names := createConfigMaps(t, ns, "cm", 5)
	cm := &corev1.ConfigMap{}
	g.Expect(env().Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: names[0]}, cm)).To(Succeed())
	child := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "child", OwnerReferences: []metav1.OwnerReference{{
		APIVersion: "v1", Kind: "ConfigMap", Name: cm.Name, UID: cm.UID, Controller: ptr.To(true),
	}}}}
	g.Expect(env().Client.Create(ctx, child)).To(Succeed())
	startSharderWith(t, user.Config(), reg, assign.Options{}, nil)

	g.Eventually(assigned(ns, names, on("a")), timeout, poll).Should(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(env().Client.Get(ctx, client.ObjectKeyFromObject(child), child)).To(Succeed())
		g.Expect(child.Labels).To(HaveKeyWithValue(v1alpha1.ShardLabel(ns), "a"))
	}, timeout, poll).Should(Succeed())
	g.Eventually(func(g Gomega) {
		cond := meta.FindStatusCondition(getRing(g, ns).Status.Conditions, v1alpha1.ConditionReady)
		g.Expect(cond).NotTo(BeNil())
		g.Expect(cond.Status).To(Equal(metav1.ConditionTrue), "%s: %s", cond.Reason, cond.Message)
	}, timeout, poll).Should(Succeed())
}
