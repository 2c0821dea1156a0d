// Package config_test checks the example's manifests: they build with
// kustomize, a real API server accepts them, and the ring, the RBAC and the
// operator's StatefulSet agree with each other.
package config_test

import (
	"context"
	"os"
	"slices"
	"testing"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/sharder-dev/sharder/internal/testenv"
	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

var suite testenv.Suite // the control plane, started for the first test that calls env

func env() *testenv.Env { return suite.Env() }

func TestMain(m *testing.M) {
	os.Exit(testenv.Run(m, &suite, testenv.Options{
		CRDDirectoryPaths: []string{"config/crd/bases", "examples/etcd-operator/config/crd"},
	}))
}

func kubectl(t *testing.T, stdin []byte, args ...string) []byte {
	t.Helper()
	return env().Kubectl(t, stdin, args...)
}

// build returns the manifests of a kustomization and its objects.
func build(t *testing.T, dir string) ([]byte, []*unstructured.Unstructured) {
	t.Helper()
	return env().Kustomize(t, dir)
}

// decode converts the one object of kind (and name, if given) into out.
func decode(t *testing.T, objs []*unstructured.Unstructured, kind, name string, out any) {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && (name == "" || o.GetName() == name) {
			data, err := yaml.Marshal(o.Object)
			if err != nil {
				t.Fatal(err)
			}
			if err := yaml.UnmarshalStrict(data, out); err != nil {
				t.Fatalf("%s %s: %v", kind, o.GetName(), err)
			}
			return
		}
	}
	t.Fatalf("no %s %q in the manifests", kind, name)
}

func TestManifestsApply(t *testing.T) {
	g := NewWithT(t)
	manifests, objs := build(t, ".")
	kinds := map[string]int{}
	for _, o := range objs {
		kinds[o.GetKind()]++
	}
	g.Expect(kinds).To(Equal(map[string]int{
		"CustomResourceDefinition": 3, "Namespace": 1, "StatefulSet": 1, "ServiceAccount": 1,
		"ClusterRole": 2, "ClusterRoleBinding": 1, "Role": 1, "RoleBinding": 1, "ControllerRing": 1,
	}))
	err := env().Client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "etcd-operator-system"}})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	out := kubectl(t, manifests, "apply", "--server-side", "--dry-run=server", "--field-manager=test", "-f", "-")
	g.Expect(string(out)).To(ContainSubstring("controllerring.sharder.dev/etcd-operator serverside-applied (server dry run)"))
	g.Expect(string(out)).To(ContainSubstring("statefulset.apps/etcd-operator serverside-applied (server dry run)"))

	samples, _ := build(t, "samples")
	out = kubectl(t, samples, "apply", "--server-side", "--dry-run=server", "--field-manager=test", "-f", "-")
	g.Expect(string(out)).To(ContainSubstring("etcdcluster.etcd.example.sharder.dev/example serverside-applied (server dry run)"))
}

// grants reports whether rules allow every verb on group/resource.
func grants(rules []rbacv1.PolicyRule, group, resource string, verbs ...string) bool {
	for _, verb := range verbs {
		ok := false
		for _, r := range rules {
			if slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) &&
				(slices.Contains(r.Verbs, verb) || slices.Contains(r.Verbs, "*")) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

// TestRingAndRBACAgree checks that the sharder may assign every resource of
// the ring, and that the operator may cache every one of them and
// acknowledge drains of its main resources.
func TestRingAndRBACAgree(t *testing.T) {
	g := NewWithT(t)
	_, objs := build(t, ".")
	var ring sharderv1alpha1.ControllerRing
	decode(t, objs, "ControllerRing", "etcd-operator", &ring)
	var sharderRole, operatorRole rbacv1.ClusterRole
	decode(t, objs, "ClusterRole", "etcd-operator:sharded-resources", &sharderRole)
	// Granted through aggregation into the sharder's rings role, whatever
	// its service account: nothing binds it.
	g.Expect(sharderRole.Labels).To(HaveKeyWithValue("sharder.dev/aggregate-to-sharder", "true"))
	for _, o := range objs {
		if o.GetKind() == "ClusterRoleBinding" || o.GetKind() == "RoleBinding" {
			ref, _, _ := unstructured.NestedString(o.Object, "roleRef", "name")
			g.Expect(ref).NotTo(Equal(sharderRole.Name), "%s %s binds the ring's role to a service account of the sharder", o.GetKind(), o.GetName())
		}
	}
	decode(t, objs, "ClusterRole", "etcd-operator", &operatorRole)

	// The clusters (with everything they control), the backups and the
	// restores: each a main resource the operator acknowledges drains of.
	var mains []string
	for _, main := range ring.Spec.Resources {
		g.Expect(main.Group).To(Equal("etcd.example.sharder.dev"))
		mains = append(mains, main.Resource)
		all := append([]metav1.GroupResource{{Group: main.Group, Resource: main.Resource}}, main.ControlledResources...)
		for _, gr := range all {
			g.Expect(grants(sharderRole.Rules, gr.Group, gr.Resource, "get", "list", "watch", "patch")).To(BeTrue(),
				"the sharder cannot assign %s", gr)
			g.Expect(grants(operatorRole.Rules, gr.Group, gr.Resource, "get", "list", "watch")).To(BeTrue(),
				"the operator cannot cache %s", gr)
		}
		g.Expect(grants(operatorRole.Rules, main.Group, main.Resource, "patch")).To(BeTrue(),
			"the operator cannot acknowledge drains of %s", main.Resource)
	}
	g.Expect(mains).To(ConsistOf("etcdclusters", "etcdbackups", "etcdrestores"))

	// The operator's instances run as the service account the ring lets
	// acknowledge drains, and hold their Leases where the ring looks.
	var sts appsv1.StatefulSet
	decode(t, objs, "StatefulSet", "etcd-operator", &sts)
	g.Expect(ring.Spec.InstanceServiceAccounts).To(ConsistOf(sharderv1alpha1.ServiceAccountReference{
		Namespace: sts.Namespace, Name: sts.Spec.Template.Spec.ServiceAccountName,
	}))
	args := sts.Spec.Template.Spec.Containers[0].Args
	g.Expect(args).To(ContainElements("--ring="+ring.Name, "--lease-namespace="+ring.Spec.LeaseNamespace))
	var leaseRole rbacv1.Role
	decode(t, objs, "Role", "etcd-operator", &leaseRole)
	g.Expect(leaseRole.Namespace).To(Equal(ring.Spec.LeaseNamespace))
	g.Expect(grants(leaseRole.Rules, "coordination.k8s.io", "leases", "get", "create", "update")).To(BeTrue())
	podEnv := map[string]bool{}
	for _, e := range sts.Spec.Template.Spec.Containers[0].Env {
		podEnv[e.Name] = e.ValueFrom != nil && e.ValueFrom.FieldRef != nil
	}
	g.Expect(podEnv).To(HaveKeyWithValue("POD_NAME", true), "the instance ID comes from the pod name")
}

// TestSlotsVariant: ../config-slots is this kustomization with the ring in
// slot mode and nothing else changed (the operator reads its ring's unit at
// start), the operator may read and watch its ring, and a real API server
// accepts the ring.
func TestSlotsVariant(t *testing.T) {
	g := NewWithT(t)
	_, base := build(t, ".")
	manifests, slots := build(t, "../config-slots")
	g.Expect(slots).To(HaveLen(len(base)))
	var objects, slotRing sharderv1alpha1.ControllerRing
	decode(t, base, "ControllerRing", "etcd-operator", &objects)
	decode(t, slots, "ControllerRing", "etcd-operator", &slotRing)
	g.Expect(objects.Spec.AssignsSlots()).To(BeFalse())
	g.Expect(slotRing.Spec.AssignsSlots()).To(BeTrue())
	g.Expect(slotRing.Spec.EffectiveSlotCount()).To(Equal(256))
	want := objects.Spec.DeepCopy()
	want.Assignment = slotRing.Spec.Assignment
	g.Expect(slotRing.Spec).To(Equal(*want), "the variant changes the ring's assignment only")

	var baseSts, slotSts appsv1.StatefulSet
	decode(t, base, "StatefulSet", "etcd-operator", &baseSts)
	decode(t, slots, "StatefulSet", "etcd-operator", &slotSts)
	g.Expect(slotSts.Spec).To(Equal(baseSts.Spec), "the operator runs as it is: the ring decides the mode")
	var operatorRole rbacv1.ClusterRole
	decode(t, slots, "ClusterRole", "etcd-operator", &operatorRole)
	g.Expect(grants(operatorRole.Rules, "sharder.dev", "controllerrings", "get", "list", "watch")).To(BeTrue(),
		"the operator cannot read and follow its ring")

	err := env().Client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "etcd-operator-system"}})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	out := kubectl(t, manifests, "apply", "--server-side", "--dry-run=server", "--field-manager=test", "-f", "-")
	g.Expect(string(out)).To(ContainSubstring("controllerring.sharder.dev/etcd-operator serverside-applied (server dry run)"))
}
