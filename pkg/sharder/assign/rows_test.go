package assign_test

import (
	"context"
	"fmt"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/ring"
	"github.com/sharder-dev/sharder/pkg/sharder/assign"
	"github.com/sharder-dev/sharder/pkg/sharder/leasecontroller"
)

// TestGenerateNameObjects: objects created with generateName get the
// instance of the name the API server gave them, assigned from their watch
// event like any other object.
func TestGenerateNameObjects(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := env().Namespace(t)
	ready := []string{"a", "b", "c"}
	reg := leasecontroller.NewRegistry()
	reg.Set(ns, members(membership.StateReady, ready...))
	newRing(t, ns, nil)
	startSharder(t, reg, assign.Options{})

	var names []string
	instances := map[string]bool{}
	for range 12 {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "gen-"}}
		g.Expect(env().Client.Create(ctx, cm)).To(Succeed())
		g.Expect(cm.Name).NotTo(Equal("gen-"))
		names = append(names, cm.Name)
		instances[expected(t, ready, ns, cm.Name)] = true
	}
	// Keyed by anything common to them (the generateName, an empty name),
	// the objects would all share one instance.
	g.Expect(len(instances)).To(BeNumerically(">", 1), "the generated names hash to several instances")

	g.Eventually(func(g Gomega) {
		got := labelsOf(g, ns)
		for _, name := range names {
			g.Expect(got[name]).To(HaveKeyWithValue(v1alpha1.ShardLabel(ns), expected(t, ready, ns, name)), name)
		}
	}, timeout, poll).Should(Succeed())
}

// tenants is a cluster-scoped custom resource, installed by
// installTenants.
var tenants = schema.GroupVersionResource{Group: "rows.test.sharder.dev", Version: "v1", Resource: "tenants"}

// installTenants installs the cluster-scoped CRD of tenants and waits until
// it is served.
func installTenants(t *testing.T) {
	t.Helper()
	g := NewWithT(t)
	ctx := context.Background()
	scheme := runtime.NewScheme()
	g.Expect(apiextensionsv1.AddToScheme(scheme)).To(Succeed())
	c, err := client.New(env().Config, client.Options{Scheme: scheme})
	g.Expect(err).NotTo(HaveOccurred())
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: tenants.Resource + "." + tenants.Group},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: tenants.Group,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: tenants.Resource, Singular: "tenant", Kind: "Tenant", ListKind: "TenantList"},
			Scope: apiextensionsv1.ClusterScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: tenants.Version, Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object", XPreserveUnknownFields: ptrTo(true),
				}},
			}},
		},
	}
	g.Expect(c.Create(ctx, crd)).To(Succeed())
	t.Cleanup(func() { _ = c.Delete(context.Background(), crd) })
	g.Eventually(func(g Gomega) {
		got := &apiextensionsv1.CustomResourceDefinition{}
		g.Expect(c.Get(ctx, client.ObjectKeyFromObject(crd), got)).To(Succeed())
		established := false
		for _, c := range got.Status.Conditions {
			if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
				established = true
			}
		}
		g.Expect(established).To(BeTrue())
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(tenants.GroupVersion().WithKind("TenantList"))
		g.Expect(env().Client.List(ctx, list)).To(Succeed())
	}, timeout, poll).Should(Succeed())
}

func ptrTo[T any](v T) *T { return &v }

// TestClusterScopedMainResource: the objects of a cluster-scoped main
// resource have no namespace, so no namespace selector applies to them;
// each gets the instance of its key "<group>/Tenant//<name>".
func TestClusterScopedMainResource(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := env().Namespace(t)
	installTenants(t)
	ready := []string{"a", "b", "c"}
	reg := leasecontroller.NewRegistry()
	reg.Set(ns, members(membership.StateReady, ready...))
	// The ring's namespace selector selects only the test namespace: it
	// must not keep cluster-scoped objects from being assigned.
	newRing(t, ns, func(s *v1alpha1.ControllerRingSpec) {
		s.Resources = []v1alpha1.RingResource{{Group: tenants.Group, Resource: tenants.Resource}}
	})

	rg := buildRing(t, v1alpha1.AlgorithmConsistentHash, ready, nil)
	want := map[string]string{}
	instances := map[string]bool{}
	create := func(name string) {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(tenants.GroupVersion().WithKind("Tenant"))
		u.SetName(name)
		g.Expect(env().Client.Create(ctx, u)).To(Succeed())
		t.Cleanup(func() { _ = env().Client.Delete(context.Background(), u) })
		id, err := rg.Lookup(ring.ObjectKey(tenants.Group, "Tenant", "", name))
		g.Expect(err).NotTo(HaveOccurred())
		want[name] = id
		instances[id] = true
	}
	for i := range 10 {
		create(fmt.Sprintf("%s-old-%d", ns, i))
	}
	startSharder(t, reg, assign.Options{})
	for i := range 5 {
		create(fmt.Sprintf("%s-new-%d", ns, i))
	}
	g.Expect(len(instances)).To(BeNumerically(">", 1), "the tenants hash to several instances")

	g.Eventually(func(g Gomega) {
		list := &metav1.PartialObjectMetadataList{}
		list.SetGroupVersionKind(tenants.GroupVersion().WithKind("TenantList"))
		g.Expect(env().Client.List(ctx, list)).To(Succeed())
		got := map[string]string{}
		for _, o := range list.Items {
			if _, ours := want[o.Name]; ours {
				got[o.Name] = o.Labels[v1alpha1.ShardLabel(ns)]
			}
		}
		g.Expect(got).To(Equal(want))
		r := getRing(g, ns)
		g.Expect(r.Status.Objects).To(BeEquivalentTo(len(want)))
		g.Expect(r.Status.UnassignedObjects).To(BeZero())
	}, timeout, poll).Should(Succeed())
}

// buildRing builds a ring of ready instances with the ring's default
// weight, or the weight given in weights.
func buildRing(t testing.TB, algorithm string, ready []string, weights map[string]int) ring.Ring {
	t.Helper()
	ms := make([]ring.Member, 0, len(ready))
	for _, id := range ready {
		w := v1alpha1.DefaultVirtualNodes
		if weights[id] > 0 {
			w = weights[id]
		}
		ms = append(ms, ring.Member{ID: id, VirtualNodes: w})
	}
	rg, err := ring.New(algorithm, ms)
	if err != nil {
		t.Fatalf("building ring: %v", err)
	}
	return rg
}

// TestWeightedInstanceGetsItsShare: an instance whose Lease says it has
// three times the default virtual nodes receives about three times the
// objects of the others. Every object is where the weighted ring puts it,
// and that ring gives heavy about half of all keys (measured on many fixed
// keys, so the check does not depend on this run's object names: a share of
// 400 random names deviates from the ring's by chance, and a bound of a few
// standard deviations failed now and then).
func TestWeightedInstanceGetsItsShare(t *testing.T) {
	g := NewWithT(t)
	ns := env().Namespace(t)
	ready := []string{"a", "b", "c", "heavy"}
	weights := map[string]int{"heavy": 3 * v1alpha1.DefaultVirtualNodes}
	ms := members(membership.StateReady, ready...)
	for i := range ms {
		ms[i].VirtualNodes = weights[ms[i].ID]
	}
	reg := leasecontroller.NewRegistry()
	reg.Set(ns, ms)
	newRing(t, ns, nil)
	const objects = 400
	names := createConfigMaps(t, ns, "cm", objects)
	startSharder(t, reg, assign.Options{})

	rg := buildRing(t, v1alpha1.AlgorithmConsistentHash, ready, weights)
	g.Eventually(func(g Gomega) {
		got := labelsOf(g, ns)
		for _, name := range names {
			id, err := rg.Lookup(ring.ObjectKey("", "ConfigMap", ns, name))
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(got[name]).To(HaveKeyWithValue(v1alpha1.ShardLabel(ns), id), name)
		}
	}, timeout, poll).Should(Succeed())

	// The ring's own share for heavy, measured on many fixed keys: half
	// (weights 1, 1, 1, 3) within what 512 virtual nodes achieve, and far
	// from the quarter heavy would hold without its weight.
	const sample = 200000
	onHeavy := 0
	for i := range sample {
		id, err := rg.Lookup(ring.ObjectKey("", "ConfigMap", "sample", fmt.Sprintf("key-%d", i)))
		g.Expect(err).NotTo(HaveOccurred())
		if id == "heavy" {
			onHeavy++
		}
	}
	ringShare := float64(onHeavy) / sample
	g.Expect(ringShare).To(BeNumerically("~", 3.0/6.0, 0.05))

	// The sharder's labels, counted: heavy holds exactly the objects the
	// ring gives it.
	wantHeavy := 0
	for _, name := range names {
		if id, _ := rg.Lookup(ring.ObjectKey("", "ConfigMap", ns, name)); id == "heavy" {
			wantHeavy++
		}
	}
	counts := map[string]int{}
	for _, l := range labelsOf(g, ns) {
		counts[l[v1alpha1.ShardLabel(ns)]]++
	}
	t.Logf("heavy holds %d of %d objects (ring share on many keys %.3f); others %v", counts["heavy"], objects, ringShare, counts)
	g.Expect(counts["heavy"]).To(Equal(wantHeavy))

	r := getRing(g, ns)
	for _, m := range r.Status.Members {
		want := v1alpha1.DefaultVirtualNodes
		if weights[m.Name] > 0 {
			want = weights[m.Name]
		}
		g.Expect(m.VirtualNodes).To(BeEquivalentTo(want), m.Name)
	}
}

// waitAssigned waits until every ConfigMap of names carries the instance
// the consistent-hash ring of ready picks, and no drain label.
func waitAssigned(g Gomega, t testing.TB, ns string, names, ready []string) {
	g.Eventually(func(g Gomega) {
		got := labelsOf(g, ns)
		for _, name := range names {
			g.Expect(got[name]).To(HaveKeyWithValue(v1alpha1.ShardLabel(ns), expected(t, ready, ns, name)), name)
			g.Expect(got[name]).NotTo(HaveKey(v1alpha1.DrainLabel(ns)), name)
		}
	}, timeout, poll).Should(Succeed())
}

// moving returns the names whose instance differs between the rings of
// before and after.
func moving(t testing.TB, ns string, names, before, after []string) []string {
	var out []string
	for _, name := range names {
		if expected(t, before, ns, name) != expected(t, after, ns, name) {
			out = append(out, name)
		}
	}
	return out
}
