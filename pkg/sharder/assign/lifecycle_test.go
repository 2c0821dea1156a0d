package assign_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/sharder/assign"
	"github.com/sharder-dev/sharder/pkg/sharder/leasecontroller"
)

// recoveryTimeout bounds a recovery that waits for the backoff of a
// failing list and watch.
const recoveryTimeout = time.Minute

// sharderRole is what the sharder needs besides the ring's resources.
var sharderRole = []rbacv1.PolicyRule{
	{APIGroups: []string{"sharder.dev"}, Resources: []string{"controllerrings"}, Verbs: []string{"get", "list", "watch", "patch", "update"}},
	{APIGroups: []string{"sharder.dev"}, Resources: []string{"controllerrings/status"}, Verbs: []string{"get", "patch", "update"}},
	{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
	{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"get", "list", "watch"}},
}

// sharderUser adds a user bound to a ClusterRole with rules and returns its
// config and the role, which the test may edit.
func sharderUser(t *testing.T, ns string, rules []rbacv1.PolicyRule) (*rest.Config, *rbacv1.ClusterRole) {
	t.Helper()
	ctx := context.Background()
	name := "sharder-" + ns
	user, err := env().Environment.ControlPlane.AddUser(envtest.User{Name: name}, env().Config)
	if err != nil {
		t.Fatalf("adding user: %v", err)
	}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}
	if err := env().Client.Create(ctx, role); err != nil {
		t.Fatalf("creating ClusterRole: %v", err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: name}},
	}
	if err := env().Client.Create(ctx, binding); err != nil {
		t.Fatalf("creating ClusterRoleBinding: %v", err)
	}
	t.Cleanup(func() {
		_ = env().Client.Delete(context.Background(), binding)
		_ = env().Client.Delete(context.Background(), role)
	})
	return user.Config(), role
}

// setRules replaces the rules of role.
func setRules(g Gomega, role *rbacv1.ClusterRole, rules []rbacv1.PolicyRule) {
	cur := &rbacv1.ClusterRole{}
	g.Expect(env().Client.Get(context.Background(), client.ObjectKeyFromObject(role), cur)).To(Succeed())
	cur.Rules = rules
	g.Expect(env().Client.Update(context.Background(), cur)).To(Succeed())
}

// readyCondition returns a check for Eventually: the ring's Ready condition
// has status and reason.
func readyCondition(name string, status metav1.ConditionStatus, reason string) func(Gomega) {
	return func(g Gomega) {
		cond := meta.FindStatusCondition(getRing(g, name).Status.Conditions, v1alpha1.ConditionReady)
		g.Expect(cond).NotTo(BeNil())
		g.Expect(cond.Status).To(Equal(status))
		g.Expect(cond.Reason).To(Equal(reason))
	}
}

// TestRevokedPermissionAfterSyncIsReportedAndHealed revokes the sharder's
// list and watch of ConfigMaps after its caches synced. The watch fails once
// it is restarted (the sharder's requests time out after 2 s here, so its
// watches restart that often): the ring turns Ready=False with reason
// ResourceForbidden and an event, and once the permission is back it is
// Ready again and assigns new objects.
func TestRevokedPermissionAfterSyncIsReportedAndHealed(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	cmRule := rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch", "patch"}}
	cfg, role := sharderUser(t, ns, append(sharderRole, cmRule))
	cfg.Timeout = 2 * time.Second

	reg := leasecontroller.NewRegistry()
	reg.Set(ns, members(membership.StateReady, "a"))
	newRing(t, ns, nil)
	names := createConfigMaps(t, ns, "cm", 3)
	startSharderWith(t, env().Config, reg, assign.Options{RESTConfig: cfg}, nil)
	g.Eventually(assigned(ns, names, on("a")), timeout, poll).Should(Succeed())
	g.Eventually(readyCondition(ns, metav1.ConditionTrue, v1alpha1.ReasonReady), timeout, poll).Should(Succeed())

	setRules(g, role, sharderRole)
	g.Eventually(readyCondition(ns, metav1.ConditionFalse, v1alpha1.ReasonResourceForbidden), timeout, poll).Should(Succeed())
	g.Eventually(func(g Gomega) []string { return ringEvents(g, ns) }, timeout, poll).Should(ContainElement(HavePrefix(v1alpha1.ReasonResourceForbidden + ": ")))

	setRules(g, role, append(sharderRole, cmRule))
	g.Eventually(readyCondition(ns, metav1.ConditionTrue, v1alpha1.ReasonReady), recoveryTimeout, poll).Should(Succeed())
	later := createConfigMaps(t, ns, "later", 2)
	g.Eventually(assigned(ns, later, on("a")), timeout, poll).Should(Succeed())
}
