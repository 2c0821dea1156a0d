package chart_test

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/internal/testenv"
)

// TestRenderFlowControl: the Lease requests of the sharder and of every
// instance ServiceAccount (named in flowControl or in a ring of the chart)
// go to the leader-election level, and the sharder's writes to a level of
// their own; the Lease FlowSchema is tried first, so the sharder's Lease
// writes are no writes of the bulk level.
func TestRenderFlowControl(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	_, objs := render(t, `
flowControl:
  instanceServiceAccounts:
  - {namespace: widget-system, name: widget-controller}
  writes:
    nominalConcurrencyShares: 7
    lendablePercent: 10
rings:
- name: widgets
  spec:
    leaseNamespace: widget-system
    resources:
    - {group: example.dev, resource: widgets}
    instanceServiceAccounts:
    - {namespace: widget-system, name: widget-controller}
    - {namespace: other-system, name: "*"}
`)
	schemas := find(objs, "FlowSchema")
	g.Expect(schemas).To(HaveLen(2))
	leases := as[flowcontrolv1.FlowSchema](t, schemas["sharder-leases"])
	writes := as[flowcontrolv1.FlowSchema](t, schemas["sharder-writes"])
	level := as[flowcontrolv1.PriorityLevelConfiguration](t, find(objs, "PriorityLevelConfiguration")["sharder-writes"])

	g.Expect(leases.Spec.PriorityLevelConfiguration.Name).To(Equal("leader-election"))
	g.Expect(leases.Spec.MatchingPrecedence).To(BeNumerically("<", writes.Spec.MatchingPrecedence))
	g.Expect(leases.Spec.Rules).To(HaveLen(1))
	g.Expect(leases.Spec.Rules[0].ResourceRules).To(Equal([]flowcontrolv1.ResourcePolicyRule{{
		APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"*"}, Namespaces: []string{"*"},
	}}))
	g.Expect(leases.Spec.Rules[0].Subjects).To(Equal([]flowcontrolv1.Subject{
		serviceAccount(namespace, "sharder"),
		serviceAccount("widget-system", "widget-controller"), // once, though named twice
		serviceAccount("other-system", "*"),
	}))

	g.Expect(writes.Spec.PriorityLevelConfiguration.Name).To(Equal(level.Name))
	g.Expect(writes.Spec.Rules).To(HaveLen(1))
	g.Expect(writes.Spec.Rules[0].Subjects).To(Equal([]flowcontrolv1.Subject{serviceAccount(namespace, "sharder")}))
	g.Expect(writes.Spec.Rules[0].ResourceRules[0].Verbs).To(ConsistOf("create", "update", "patch", "delete"))
	g.Expect(level.Spec.Limited.NominalConcurrencyShares).To(HaveValue(BeEquivalentTo(7)))
	g.Expect(level.Spec.Limited.LendablePercent).To(HaveValue(BeEquivalentTo(10)))

	_, objs = render(t, "flowControl:\n  leasePriorityLevel: workload-high\nserviceAccount:\n  name: mine\n")
	leases = as[flowcontrolv1.FlowSchema](t, find(objs, "FlowSchema")["sharder-leases"])
	g.Expect(leases.Spec.PriorityLevelConfiguration.Name).To(Equal("workload-high"))
	g.Expect(leases.Spec.Rules[0].Subjects).To(Equal([]flowcontrolv1.Subject{serviceAccount(namespace, "mine")}))
}

// TestFlowControlMatchesConfig keeps config/flowcontrol (kustomize) in line
// with what the chart renders by default.
func TestFlowControlMatchesConfig(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	var want []*unstructured.Unstructured
	for _, file := range []string{"flowschemas.yaml", "priority_level.yaml"} {
		data, err := os.ReadFile(filepath.Join(repoRoot(t), "config", "flowcontrol", file))
		g.Expect(err).NotTo(HaveOccurred())
		objs, err := testenv.DecodeObjects(data)
		g.Expect(err).NotTo(HaveOccurred())
		want = append(want, objs...)
	}
	_, rendered := render(t, "")
	var got []*unstructured.Unstructured
	for _, o := range rendered {
		if o.GetObjectKind().GroupVersionKind().Group == flowcontrolv1.GroupName {
			got = append(got, o)
		}
	}
	g.Expect(got).To(HaveLen(len(want)))
	for i := range want {
		g.Expect(got[i].GetKind()).To(Equal(want[i].GetKind()))
		g.Expect(got[i].GetName()).To(Equal(want[i].GetName()))
		g.Expect(got[i].Object["spec"]).To(Equal(want[i].Object["spec"]),
			"%s %s: config/flowcontrol differs from charts/sharder/templates/flowcontrol.yaml", want[i].GetKind(), want[i].GetName())
	}
}

func serviceAccount(namespace, name string) flowcontrolv1.Subject {
	return flowcontrolv1.Subject{Kind: flowcontrolv1.SubjectKindServiceAccount,
		ServiceAccount: &flowcontrolv1.ServiceAccountSubject{Namespace: namespace, Name: name}}
}

// classification is where the API server's priority and fairness put a
// request: the UIDs of the FlowSchema and of the priority level it names in
// its response headers.
type classification struct{ flowSchema, priorityLevel types.UID }

// classify sends a request as the ServiceAccount namespace/name
// (impersonated: its user name and the groups its token would give it)
// and returns how the API server classified it. The request need not
// succeed: the API server classifies it before it authorizes it.
func classify(t *testing.T, namespace, name, method, path string) classification {
	t.Helper()
	cfg := rest.CopyConfig(env().Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + namespace + ":" + name}
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(method, strings.TrimSuffix(cfg.Host, "/")+path, strings.NewReader(`{"metadata":{"labels":{"example":"x"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/merge-patch+json")
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	_ = resp.Body.Close()
	return classification{
		flowSchema:    types.UID(resp.Header.Get(flowcontrolv1.ResponseHeaderMatchedFlowSchemaUID)),
		priorityLevel: types.UID(resp.Header.Get(flowcontrolv1.ResponseHeaderMatchedPriorityLevelConfigurationUID)),
	}
}

// TestFlowControlClassifies applies the chart's FlowSchemas and priority
// level to a real API server (priority and fairness on) and reads how it
// classifies requests of the sharder's and an instance's ServiceAccounts.
// Without them a Lease renewal and a label patch of one ServiceAccount land
// in the same FlowSchema and priority level: the same flow, one queue. With
// them the Lease requests of both go to the leader-election level, and the
// sharder's label patches to a level of their own.
func TestFlowControlClassifies(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ctx := context.Background()
	const (
		sharderAccount    = "apf-sharder" // the chart's ServiceAccount with fullnameOverride apf-sharder
		instanceNamespace = "apf-instances"
		instanceAccount   = "apf-instance"
	)
	leaderLease := "/apis/coordination.k8s.io/v1/namespaces/" + namespace + "/leases/" + sharderAccount
	instanceLease := "/apis/coordination.k8s.io/v1/namespaces/" + instanceNamespace + "/leases/instance-0"
	object := "/api/v1/namespaces/" + instanceNamespace + "/configmaps/object-0"
	leaderRenewal := func() classification { return classify(t, namespace, sharderAccount, http.MethodPut, leaderLease) }
	instanceRenewal := func() classification {
		return classify(t, instanceNamespace, instanceAccount, http.MethodPut, instanceLease)
	}
	labelPatch := func() classification { return classify(t, namespace, sharderAccount, http.MethodPatch, object) }
	instancePatch := func() classification {
		return classify(t, instanceNamespace, instanceAccount, http.MethodPatch, object)
	}

	// Without the chart's objects.
	before := labelPatch()
	g.Expect(before.flowSchema).NotTo(BeEmpty(), "the API server runs priority and fairness")
	g.Expect(leaderRenewal()).To(Equal(before), "without FlowSchemas the leader's renewals share the flow of its label patches")
	g.Expect(instanceRenewal()).To(Equal(instancePatch()), "without FlowSchemas an instance's renewals share the flow of its own writes")
	g.Expect(instanceRenewal().priorityLevel).To(Equal(before.priorityLevel), "and the level of the sharder's label patches")

	_, objs := render(t, `
fullnameOverride: apf-sharder
flowControl:
  instanceServiceAccounts:
  - {namespace: apf-instances, name: apf-instance}
`)
	c := env().Client
	for _, o := range objs {
		if o.GetKind() != "FlowSchema" && o.GetKind() != "PriorityLevelConfiguration" {
			continue
		}
		g.Expect(c.Create(ctx, o)).To(Succeed())
		t.Cleanup(func() { _ = c.Delete(context.Background(), o) })
	}
	var leases, writes flowcontrolv1.FlowSchema
	var leaderElection, writesLevel flowcontrolv1.PriorityLevelConfiguration
	g.Expect(c.Get(ctx, client.ObjectKey{Name: "apf-sharder-leases"}, &leases)).To(Succeed())
	g.Expect(c.Get(ctx, client.ObjectKey{Name: "apf-sharder-writes"}, &writes)).To(Succeed())
	g.Expect(c.Get(ctx, client.ObjectKey{Name: "leader-election"}, &leaderElection)).To(Succeed())
	g.Expect(c.Get(ctx, client.ObjectKey{Name: "apf-sharder-writes"}, &writesLevel)).To(Succeed())

	// The API server takes up new flow control objects within a moment.
	g.Eventually(leaderRenewal).WithTimeout(30 * time.Second).WithPolling(100 * time.Millisecond).
		Should(Equal(classification{leases.UID, leaderElection.UID}))
	g.Eventually(labelPatch).WithTimeout(30 * time.Second).WithPolling(100 * time.Millisecond).
		Should(Equal(classification{writes.UID, writesLevel.UID}))
	g.Expect(instanceRenewal()).To(Equal(classification{leases.UID, leaderElection.UID}))
	g.Expect(instancePatch()).NotTo(Equal(classification{writes.UID, writesLevel.UID}), "the instances' own writes are not the sharder's")
}
