package webhook_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/sharder/webhook"
)

func statefulSet(ns, name string, labels map[string]string) *appsv1.StatefulSet {
	sel := map[string]string{"app": name}
	return &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec: appsv1.StatefulSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: sel},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: sel},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "example.invalid/c"}}},
			},
		},
	}
}

func service(ns, name string, labels map[string]string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}},
	}
}

func widget(ns, name string, labels map[string]string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("webhook-test.sharder.dev/v1")
	u.SetKind("Widget")
	u.SetNamespace(ns)
	u.SetName(name)
	u.SetLabels(labels)
	return u
}

// relabelStatus reads obj with c, applies change to its labels and sends the
// whole object to the status subresource.
func relabelStatus(c client.Client, obj client.Object, change func(map[string]string)) error {
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(obj), obj); err != nil {
		return err
	}
	l := obj.GetLabels()
	if l == nil {
		l = map[string]string{}
	}
	change(l)
	obj.SetLabels(l)
	return c.Status().Update(context.Background(), obj)
}

// TestStatusSubresourceCannotChangeLabels: for built-in kinds such as
// StatefulSets and Services, the API server applies metadata changes sent to
// the status subresource; the webhook must check them as it checks the main
// resource. A custom resource's status subresource drops metadata changes
// itself.
func TestStatusSubresourceCannotChangeLabels(t *testing.T) {
	ctx := context.Background()
	g := NewWithT(t)
	ns := env().Namespace(t)
	r := createRing(t, ns, func(r *v1alpha1.ControllerRing) {
		r.Spec.Resources = []v1alpha1.RingResource{{
			Group: "webhook-test.sharder.dev", Resource: "widgets",
			ControlledResources: []metav1.GroupResource{{Group: "apps", Resource: "statefulsets"}, {Resource: "services"}},
		}}
	})
	startSharder(t, webhook.Options{})
	shard, drain := v1alpha1.ShardLabel(r.Name), v1alpha1.DrainLabel(r.Name)
	sh, alice, inst := clientAs(t, sharderUser), clientAs(t, userAlice), clientAs(t, instanceUser)

	sts := statefulSet(ns, "sts", map[string]string{shard: "inst-a"})
	g.Expect(sh.Create(ctx, sts)).To(Succeed())
	svc := service(ns, "svc", map[string]string{shard: "inst-a"})
	g.Expect(sh.Create(ctx, svc)).To(Succeed())
	w := widget(ns, "widget", map[string]string{shard: "inst-a"})
	g.Expect(sh.Create(ctx, w)).To(Succeed())

	// The webhook is active once an edit of the main resource is denied.
	g.Eventually(func() error {
		err := relabel(alice, statefulSet(ns, sts.Name, nil), func(l map[string]string) { l[shard] = "inst-b" }, client.DryRunAll)
		if err == nil {
			return errors.New("label edit allowed: webhook not active yet")
		}
		if !apierrors.IsForbidden(err) {
			return fmt.Errorf("not (yet) denied by the webhook: %w", err)
		}
		return nil
	}).WithTimeout(30 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())

	for _, tc := range []struct {
		name  string
		obj   func() client.Object
		empty func() client.Object
	}{
		{"statefulsets/status", func() client.Object { return statefulSet(ns, sts.Name, nil) }, func() client.Object { return &appsv1.StatefulSet{} }},
		{"services/status", func() client.Object { return service(ns, svc.Name, nil) }, func() client.Object { return &corev1.Service{} }},
	} {
		t.Run("a label change through "+tc.name+" is denied", func(t *testing.T) {
			g := NewWithT(t)
			for _, c := range []client.Client{alice, inst} {
				expectDenied(g, relabelStatus(c, tc.obj(), func(l map[string]string) { l[shard] = "inst-b" }), `label "`+shard+`"`)
				expectDenied(g, relabelStatus(c, tc.obj(), func(l map[string]string) { delete(l, shard) }), shard)
				expectDenied(g, relabelStatus(c, tc.obj(), func(l map[string]string) { l[drain] = "true" }), `label "`+drain+`"`)
				expectDenied(g, c.Status().Patch(ctx, tc.obj(), client.RawPatch(types.MergePatchType,
					[]byte(`{"metadata":{"labels":{"`+shard+`":"inst-c"}}}`))), shard)
			}
			got := tc.empty()
			g.Expect(sh.Get(ctx, client.ObjectKeyFromObject(tc.obj()), got)).To(Succeed())
			g.Expect(got.GetLabels()).To(Equal(map[string]string{shard: "inst-a"}), "a denied write changed the object")

			// The sharder itself still writes through the status subresource.
			g.Expect(relabelStatus(sh, tc.obj(), func(l map[string]string) { l[shard] = "inst-b" })).To(Succeed())
			g.Expect(relabelStatus(sh, tc.obj(), func(l map[string]string) { l[shard] = "inst-a" })).To(Succeed())
		})
	}

	t.Run("status updates that leave the labels alone do not reach the webhook", func(t *testing.T) {
		g := NewWithT(t)
		before := webhookCalls(r.Name)
		for i := range 3 {
			s := &appsv1.StatefulSet{}
			g.Expect(inst.Get(ctx, client.ObjectKeyFromObject(sts), s)).To(Succeed())
			s.Status.ObservedGeneration = int64(i + 1)
			g.Expect(inst.Status().Update(ctx, s)).To(Succeed())
		}
		g.Expect(relabelStatus(inst, widget(ns, w.GetName(), nil), func(map[string]string) {})).To(Succeed())
		g.Expect(webhookCalls(r.Name)).To(Equal(before))
	})

	t.Run("a custom resource's status subresource does not change labels", func(t *testing.T) {
		g := NewWithT(t)
		err := relabelStatus(alice, widget(ns, w.GetName(), nil), func(l map[string]string) { l[shard] = "inst-b" })
		if err != nil {
			expectDenied(g, err, shard)
		}
		got := widget(ns, w.GetName(), nil)
		g.Expect(sh.Get(ctx, client.ObjectKeyFromObject(got), got)).To(Succeed())
		g.Expect(got.GetLabels()).To(Equal(map[string]string{shard: "inst-a"}))
	})
}
