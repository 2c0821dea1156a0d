package assign_test

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
