package assign_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionshelpers "k8s.io/apiextensions-apiserver/pkg/apihelpers"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
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

var gadgets = schema.GroupResource{Group: "lifecycle-test.sharder.dev", Resource: "gadgets"}

// installGadgets creates the CustomResourceDefinition of namespaced
// Gadgets served at version only, and waits until it is established.
func installGadgets(t *testing.T, g Gomega, version string) {
	t.Helper()
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: gadgets.String()},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: gadgets.Group,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Kind: "Gadget", ListKind: "GadgetList", Plural: "gadgets", Singular: "gadget"},
			Scope: apiextensionsv1.NamespaceScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: version, Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object", XPreserveUnknownFields: ptr.To(true),
				}},
			}},
		},
	}
	g.Expect(env().Client.Create(context.Background(), crd)).To(Succeed())
	t.Cleanup(func() { removeGadgets(g) })
	g.Eventually(func(g Gomega) {
		cur := &apiextensionsv1.CustomResourceDefinition{}
		g.Expect(env().Client.Get(context.Background(), client.ObjectKeyFromObject(crd), cur)).To(Succeed())
		g.Expect(cur.Spec.Versions[0].Name).To(Equal(version))
		g.Expect(apiextensionshelpers.IsCRDConditionTrue(cur, apiextensionsv1.Established)).To(BeTrue())
	}, timeout, poll).Should(Succeed())
}

// removeGadgets deletes the Gadgets' CustomResourceDefinition and waits
// until it is gone.
func removeGadgets(g Gomega) {
	crd := &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: gadgets.String()}}
	g.Expect(client.IgnoreNotFound(env().Client.Delete(context.Background(), crd))).To(Succeed())
	g.Eventually(func() error {
		return env().Client.Get(context.Background(), client.ObjectKeyFromObject(crd), crd)
	}, recoveryTimeout, poll).Should(Satisfy(apierrors.IsNotFound))
}

// createGadget creates Gadget ns/name at version.
func createGadget(g Gomega, version, ns, name string) {
	dc, err := dynamic.NewForConfig(env().Config)
	g.Expect(err).NotTo(HaveOccurred())
	obj := &unstructured.Unstructured{}
	obj.SetAPIVersion(gadgets.Group + "/" + version)
	obj.SetKind("Gadget")
	obj.SetName(name)
	_, err = dc.Resource(gadgets.WithVersion(version)).Namespace(ns).Create(context.Background(), obj, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
}

// gadgetShard returns a check for Eventually: Gadget ns/name at version
// carries the ring's shard label with value id.
func gadgetShard(version, ns, name, id string) func(Gomega) {
	return func(g Gomega) {
		mc, err := metadata.NewForConfig(env().Config)
		g.Expect(err).NotTo(HaveOccurred())
		obj, err := mc.Resource(gadgets.WithVersion(version)).Namespace(ns).Get(context.Background(), name, metav1.GetOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(obj.Labels).To(HaveKeyWithValue(v1alpha1.ShardLabel(ns), id))
	}
}

// TestRecreatedCRDWithAnotherVersionIsResolvedAgain deletes the
// CustomResourceDefinition of a ring's resource after the ring synced and
// installs it again serving another version only. The ring reports the
// resource as not served meanwhile, then resolves it again at its new
// version (within its ResolveInterval, 2 s here) and assigns its objects.
func TestRecreatedCRDWithAnotherVersionIsResolvedAgain(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	installGadgets(t, g, "v1")
	reg := leasecontroller.NewRegistry()
	reg.Set(ns, members(membership.StateReady, "a"))
	newRing(t, ns, func(s *v1alpha1.ControllerRingSpec) {
		s.Resources = []v1alpha1.RingResource{{Group: gadgets.Group, Resource: gadgets.Resource}}
	})
	resolve := 2 * time.Second
	startSharder(t, reg, assign.Options{ResolveInterval: &resolve})
	createGadget(g, "v1", ns, "first")
	g.Eventually(gadgetShard("v1", ns, "first", "a"), timeout, poll).Should(Succeed())

	removeGadgets(g)
	g.Eventually(readyCondition(ns, metav1.ConditionFalse, v1alpha1.ReasonResourceNotServed), timeout, poll).Should(Succeed())

	installGadgets(t, g, "v2")
	createGadget(g, "v2", ns, "second")
	g.Eventually(gadgetShard("v2", ns, "second", "a"), recoveryTimeout, poll).Should(Succeed())
	g.Eventually(readyCondition(ns, metav1.ConditionTrue, v1alpha1.ReasonReady), timeout, poll).Should(Succeed())
}

// TestDeletedRingLeavesNoObjectDrained deletes a ring while drains are in
// flight (a new instance joined and nothing acknowledges). The ring goes
// only after the sharder removed its labels: no object is left drained, or
// labelled for an instance of a ring that no longer exists.
func TestDeletedRingLeavesNoObjectDrained(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	reg := leasecontroller.NewRegistry()
	reg.Set(ns, members(membership.StateReady, "a"))
	ring := newRing(t, ns, nil)
	names := createConfigMaps(t, ns, "cm", 20)
	startSharder(t, reg, assign.Options{})
	g.Eventually(assigned(ns, names, on("a")), timeout, poll).Should(Succeed())
	g.Eventually(func(g Gomega) []string { return getRing(g, ns).Finalizers }, timeout, poll).Should(ContainElement(v1alpha1.FinalizerLabels))

	reg.Set(ns, members(membership.StateReady, "a", "b"))
	g.Eventually(func(g Gomega) {
		drained := 0
		for _, l := range labelsOf(g, ns) {
			if _, ok := l[v1alpha1.DrainLabel(ns)]; ok {
				drained++
			}
		}
		g.Expect(drained).To(BeNumerically(">", 0))
	}, timeout, poll).Should(Succeed())

	g.Expect(env().Client.Delete(context.Background(), ring)).To(Succeed())
	g.Eventually(func() error {
		return env().Client.Get(context.Background(), client.ObjectKeyFromObject(ring), &v1alpha1.ControllerRing{})
	}, timeout, poll).Should(Satisfy(apierrors.IsNotFound))
	g.Eventually(func(g Gomega) []string { return ringEvents(g, ns) }, timeout, poll).Should(ContainElement(HavePrefix("LabelsRemoved: ")))
	for name, m := range metadataOf(g, ns) {
		g.Expect(m.Labels).NotTo(HaveKey(v1alpha1.ShardLabel(ns)), name)
		g.Expect(m.Labels).NotTo(HaveKey(v1alpha1.DrainLabel(ns)), name)
		g.Expect(m.Annotations).NotTo(HaveKey(v1alpha1.DrainStartedAnnotation(ns)), name)
	}
}
