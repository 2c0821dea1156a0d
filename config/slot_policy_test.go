package config_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/sharder/slotpolicy"
)

// impersonating returns a client of the test's control plane acting as user.
func impersonating(t *testing.T, user string) client.Client {
	t.Helper()
	cfg := rest.CopyConfig(env().Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	c, err := client.New(cfg, client.Options{Scheme: env().Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// create creates obj for the rest of the test.
func create(t *testing.T, obj client.Object) {
	t.Helper()
	ctx := context.Background()
	if err := env().Client.Create(ctx, obj); err != nil {
		t.Fatalf("creating %s: %v", obj.GetName(), err)
	}
	t.Cleanup(func() {
		if err := env().Client.Delete(ctx, obj); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting %s: %v", obj.GetName(), err)
		}
	})
}

// TestSlotLabelPolicy applies the policy guarding the slot label and binds
// it, as the sharder does (slotpolicy.Binding), to a ring of 8 slots for
// ConfigMaps of one namespace. A user who may write ConfigMaps (alice) may create one with a
// slot of the ring or none, and change nothing about its slot afterwards;
// the sharder (who may write the ring's status) may also set the slot on an
// object without one, and remove it only while the ring is being deleted.
func TestSlotLabelPolicy(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	_, objs := build(t, "policy")
	g.Expect(objs).To(HaveLen(1))
	create(t, objs[0])

	const ring, key = "slotted", "slot.sharder.dev/slotted"
	ns := env().Namespace(t)
	typed := &v1alpha1.ControllerRing{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "ControllerRing"},
		ObjectMeta: metav1.ObjectMeta{Name: ring, Finalizers: []string{"test.sharder.dev/keep"}},
		Spec: v1alpha1.ControllerRingSpec{
			LeaseNamespace:    "default",
			Resources:         []v1alpha1.RingResource{{Resource: "configmaps"}},
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: ns}},
			Assignment:        &v1alpha1.RingAssignment{Unit: v1alpha1.AssignmentUnitSlots, Slots: &v1alpha1.RingSlots{Count: 8}},
		},
	}
	content, err := runtime.DefaultUnstructuredConverter.ToUnstructured(typed)
	g.Expect(err).NotTo(HaveOccurred())
	r := &unstructured.Unstructured{Object: content}
	create(t, r)
	t.Cleanup(func() {
		// Let the ring go once the test is done with it.
		_ = env().Client.Patch(ctx, slotRing(ring, nil), client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"finalizers":null}}`)))
	})
	typed.UID = r.GetUID()
	// The binding as the sharder writes it.
	create(t, slotpolicy.Binding(typed))

	// alice writes ConfigMaps; the sharder writes them and the ring's status.
	create(t, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "slot-test-configmaps"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"*"}}},
	})
	create(t, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "slot-test-ring-status"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"sharder.dev"}, Resources: []string{"controllerrings/status"}, Verbs: []string{"update", "patch"}}},
	})
	bind := func(role string, users ...string) {
		b := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: role},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		}
		for _, u := range users {
			b.Subjects = append(b.Subjects, rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: u})
		}
		create(t, b)
	}
	bind("slot-test-configmaps", "alice", "sharder")
	bind("slot-test-ring-status", "sharder")
	alice, sharder := impersonating(t, "alice"), impersonating(t, "sharder")

	configMap := func(name string, labels map[string]string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels}}
	}
	// The API server applies a new policy and binding a moment later.
	g.Eventually(func() error {
		return alice.Create(ctx, configMap("probe", map[string]string{key: "8"}), client.DryRunAll)
	}).WithTimeout(30 * time.Second).Should(MatchError(ContainSubstring("must name a slot of ring slotted")))

	// Creations: a slot of the ring or none.
	for value, allowed := range map[string]bool{"0": true, "7": true, "8": false, "08": false, "": false, "x": false, "100000": false} {
		err := alice.Create(ctx, configMap("created", map[string]string{key: value}), client.DryRunAll)
		if allowed {
			g.Expect(err).NotTo(HaveOccurred(), "slot %q", value)
		} else {
			g.Expect(err).To(MatchError(ContainSubstring("must name a slot of ring slotted")), "slot %q", value)
		}
	}
	elsewhere := configMap("elsewhere", map[string]string{key: "99"})
	elsewhere.Namespace = env().Namespace(t)
	g.Expect(alice.Create(ctx, elsewhere, client.DryRunAll)).To(Succeed(), "a namespace the ring does not select is not guarded")
	g.Expect(alice.Create(ctx, configMap("unlabelled", nil))).To(Succeed())
	g.Expect(alice.Create(ctx, configMap("labelled", map[string]string{key: "3"}))).To(Succeed())

	// label merge-patches the labels of a ConfigMap as user.
	label := func(c client.Client, name, labels string) error {
		return c.Patch(ctx, configMap(name, nil), client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"labels":`+labels+`}}`)))
	}
	neverChanges := ContainSubstring("never changes once set")
	g.Expect(label(alice, "labelled", `{"`+key+`":"4"}`)).To(MatchError(neverChanges))
	g.Expect(label(alice, "labelled", `{"`+key+`":null}`)).To(MatchError(neverChanges))
	g.Expect(label(alice, "labelled", `{"other":"x"}`)).To(Succeed(), "other labels change freely")
	g.Expect(label(alice, "unlabelled", `{"`+key+`":"2"}`)).To(MatchError(ContainSubstring("only the sharder sets the label")))
	g.Expect(label(sharder, "labelled", `{"`+key+`":"4"}`)).To(MatchError(neverChanges))
	g.Expect(label(sharder, "labelled", `{"`+key+`":null}`)).To(MatchError(neverChanges), "not while the ring lives")
	g.Expect(label(sharder, "unlabelled", `{"`+key+`":"9"}`)).To(MatchError(ContainSubstring("must name a slot")))
	g.Expect(label(sharder, "unlabelled", `{"`+key+`":"2"}`)).To(Succeed())
	g.Expect(label(sharder, "unlabelled", `{"`+key+`":"3"}`)).To(MatchError(neverChanges))

	// While the ring is being deleted, the sharder removes its labels; others
	// still may not.
	g.Expect(alice.Create(ctx, configMap("labelled-too", map[string]string{key: "5"}))).To(Succeed())
	g.Expect(env().Client.Delete(ctx, slotRing(ring, nil))).To(Succeed())
	g.Eventually(func() error {
		return label(sharder, "labelled", `{"`+key+`":null}`)
	}).WithTimeout(30 * time.Second).Should(Succeed())
	g.Expect(label(alice, "labelled-too", `{"`+key+`":null}`)).To(MatchError(neverChanges))
	g.Expect(label(sharder, "labelled-too", `{"`+key+`":"6"}`)).To(MatchError(neverChanges), "nor changed")
	got := &corev1.ConfigMap{}
	g.Expect(env().Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "labelled"}, got)).To(Succeed())
	g.Expect(got.Labels).NotTo(HaveKey(key))
}
