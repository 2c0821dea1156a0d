package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// What the scenarios install: the chart as release "ring-sharder" in
// sharding-system with its default values and one ring declared in them,
// and a ring of ConfigMaps in one namespace whose instance is a Lease held
// for a pod. Neither name is the default of config/default or of the
// examples: the examples' ring RBAC must work for any release.
const (
	release          = "ring-sharder"
	sharderNamespace = "sharding-system"
	ring             = "e2e"
	objectsNamespace = "e2e-objects"
	leaseNamespace   = "e2e-instances"
	// chartRing is the ring declared in the chart's values.
	chartRing = "e2e-chart"
	instance  = "instance-0"
	// pauseImage is loaded into the cluster by make cluster (make images).
	pauseImage = "ghcr.io/sharder-dev/pause:1.0"
)

// operatorLogs is the node's folder for the reconcile logs of the example
// operator, which the operator scenario installs and the scenarios after it
// use until the chart's test ends. The folder lives as long: a pod of the
// operator replaced later (a force delete) mounts it, and cannot start
// without it.
var operatorLogs string

// plainLogs is the node's folder for the reconcile logs of the plain
// controller, which its scenario installs and the scenarios after it scale
// and check until the chart's test ends, for the same reasons.
var plainLogs string

// TestSharderChart installs the chart, checks that it works as the docs say,
// collects an instance's Lease with its pod, and uninstalls it. The steps
// build on each other: a failed step ends the test.
func TestSharderChart(t *testing.T) {
	t.Cleanup(func() {
		if t.Failed() {
			dumpState(t, sharderNamespace, "app.kubernetes.io/name=sharder")
		}
	})
	operatorLogs = reconcileLogDir(t)
	plainLogs = reconcileLogDir(t)
	steps := []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"install", testInstall},
		{"a real Prometheus runs the dashboard's queries and each alert on the sharder's metrics", testPrometheus},
		{"lease of a deleted pod is collected", testLeaseCollectedWithPod},
		{"plain controller with the agent sidecar rolls without overlap", testPlainControllerWithAgent},
		{"shell controller with the agent sidecar rolls without overlap", testShellControllerWithAgent},
		{"a rollout of the sharder keeps each drain's timeout", testSharderRolloutKeepsDrains},
		{"flow control keeps the Leases through a rebalance of many objects", testFlowControl},
		{"etcd operator scales from 3 to 4 instances", testEtcdOperator},
		{"an EtcdCluster of 3 runs real etcd", testRealEtcd},
		{"an EtcdCluster with TLS and auth forms while its instance is killed", testRealEtcdTLS},
		{"an EtcdCluster backed up and restored through an S3 store", testBackupRestore},
		{"etcd operator in slot mode rolls without writing an object", testEtcdOperatorSlots},
		{"uninstall leaves nothing that rejects writes", testUninstall},
	}
	for _, s := range steps {
		if !t.Run(s.name, s.fn) {
			return
		}
	}
}

// testInstall: helm install with default values gives two Ready replicas,
// one leader, membership visible in Leases and the ring, assignment, and a
// webhook that answers through its Service with its own certificate.
func testInstall(t *testing.T) {
	g := NewWithT(t)
	ctx := t.Context()
	// The default values, and one ring declared in them (which the
	// uninstall must not leave terminating): Secrets of namespaces that do
	// not exist, so that its webhook stands in nobody's way.
	values := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(values, []byte(`rings:
- name: `+chartRing+`
  spec:
    leaseNamespace: `+sharderNamespace+`
    namespaceSelector:
      matchLabels: {e2e.sharder.dev/chart-ring: "true"}
    resources:
    - {resource: secrets}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	// As a user installs a published release: the chart from an OCI
	// registry (the suite's, see startRegistry).
	if _, err := helm(ctx, "install", release, "oci://"+registryRepo+"/charts/sharder", "--version", published.chartVersion, "--plain-http",
		"--namespace", sharderNamespace, "--create-namespace", "--values", values); err != nil {
		t.Fatal(err)
	}

	By(t, "two replicas become Ready")
	g.Eventually(func(g Gomega) {
		var dep appsv1.Deployment
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: sharderNamespace, Name: release}, &dep)).To(Succeed())
		g.Expect(dep.Status.ReadyReplicas).To(Equal(int32(2)))
	}).WithTimeout(3 * time.Minute).WithPolling(time.Second).Should(Succeed())
	pods := podNames(ctx, g, sharderNamespace, "app.kubernetes.io/name=sharder")
	g.Expect(pods).To(HaveLen(2))

	By(t, "the node pulls an image from the registry")
	pulled := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: sharderNamespace, Name: "registry-pull"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "pause", Image: registryRepo + "/pause:" + registryTag, Command: []string{"/registry-pause"},
			SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false)},
		}}},
	}
	g.Expect(k8sClient.Create(ctx, pulled)).To(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(pulled), pulled)).To(Succeed())
		g.Expect(pulled.Status.ContainerStatuses).To(ConsistOf(And(
			HaveField("Ready", BeTrue()),
			HaveField("ImageID", Equal(published.pulledImage.String())),
		)), "runs the digest pushed")
	}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
	g.Expect(k8sClient.Delete(ctx, pulled, client.GracePeriodSeconds(0))).To(Succeed())

	By(t, "one replica leads")
	g.Eventually(func(g Gomega) {
		var lease coordinationv1.Lease
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: sharderNamespace, Name: release}, &lease)).To(Succeed())
		holder := ptr.Deref(lease.Spec.HolderIdentity, "")
		// controller-runtime's identity is <hostname>_<random>; the hostname is the pod's name.
		g.Expect(slices.ContainsFunc(pods, func(p string) bool { return strings.HasPrefix(holder, p+"_") })).To(BeTrue(), "leader %q is one of %v", holder, pods)
	}).WithTimeout(time.Minute).Should(Succeed())

	By(t, "a ring with one instance, whose Lease belongs to a pod")
	createRing(ctx, g)
	waitDefaultServiceAccount(ctx, g, leaseNamespace)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: leaseNamespace, Name: instance},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr.To[int64](5),
			Containers: []corev1.Container{{
				Name: "instance", Image: pauseImage, ImagePullPolicy: corev1.PullNever,
				SecurityContext: &corev1.SecurityContext{RunAsNonRoot: ptr.To(true), AllowPrivilegeEscalation: ptr.To(false)},
			}},
		},
	}
	g.Expect(k8sClient.Create(ctx, pod)).To(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(pod), pod)).To(Succeed())
		g.Expect(pod.Status.Phase).To(Equal(corev1.PodRunning))
	}).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
	// The Lease an instance holds for its pod (pkg/instance with POD_UID),
	// held for an hour so that it stays ready without renewals.
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: leaseNamespace, Name: instance,
			Labels:          map[string]string{sharderv1alpha1.LabelRing: ring},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID}},
		},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       ptr.To(instance),
			LeaseDurationSeconds: ptr.To[int32](3600),
			RenewTime:            &metav1.MicroTime{Time: time.Now()},
		},
	}
	g.Expect(k8sClient.Create(ctx, lease)).To(Succeed())

	By(t, "kubectl shows the membership in the Leases and the ring")
	g.Eventually(func(g Gomega) {
		out, err := kubectl(ctx, "get", "leases", "--namespace", leaseNamespace, "-L", sharderv1alpha1.LabelState)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(row(out, instance)).To(ContainElements(instance, "ready"), out)
	}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
	g.Eventually(func(g Gomega) {
		out, err := kubectl(ctx, "get", "controllerrings")
		g.Expect(err).NotTo(HaveOccurred())
		// NAME READY AVAILABLE INSTANCES OBJECTS AGE
		fields := row(out, ring)
		g.Expect(fields).To(HaveLen(6), out)
		g.Expect(fields[2:4]).To(Equal([]string{"1", "1"}), "available and instances:\n%s", out)
	}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())

	By(t, "the leader assigns a new object to the instance")
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: objectsNamespace, Name: "assigned"}}
	g.Expect(k8sClient.Create(ctx, cm)).To(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(cm), cm)).To(Succeed())
		g.Expect(cm.Labels).To(HaveKeyWithValue(sharderv1alpha1.ShardLabel(ring), instance))
	}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())

	By(t, "the webhook, reached through its Service, denies moving the object by hand")
	g.Eventually(func(g Gomega) {
		var cfg admissionregistrationv1.ValidatingWebhookConfiguration
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Name: release}, &cfg)).To(Succeed())
		g.Expect(cfg.Webhooks).NotTo(BeEmpty())
		for _, w := range cfg.Webhooks {
			g.Expect(w.ClientConfig.Service).NotTo(BeNil(), w.Name)
			g.Expect(w.ClientConfig.Service.Namespace).To(Equal(sharderNamespace), w.Name)
			g.Expect(w.ClientConfig.CABundle).NotTo(BeEmpty(), "%s: the self-managed CA is injected", w.Name)
		}
	}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
	webhookName := ring + ".shard-label.sharder.dev"
	g.Eventually(func() error {
		patch := client.MergeFrom(cm.DeepCopy())
		moved := cm.DeepCopy()
		moved.Labels[sharderv1alpha1.ShardLabel(ring)] = "elsewhere"
		err := k8sClient.Patch(ctx, moved, patch)
		switch {
		case err == nil:
			return StopTrying("an admin moved the object by hand: the webhook allowed it")
		case strings.Contains(err.Error(), fmt.Sprintf("admission webhook %q denied the request", webhookName)):
			return nil
		default:
			// Not the webhook's answer (e.g. its endpoints are not
			// programmed yet, and the ring fails closed): try again.
			return err
		}
	}).WithTimeout(time.Minute).WithPolling(2 * time.Second).Should(Succeed())

	By(t, "helm test: the webhook answers through its Service and sharder status reads the ring")
	out, err := helm(ctx, "test", release, "--namespace", sharderNamespace, "--logs", "--timeout", "3m")
	g.Expect(err).NotTo(HaveOccurred(), out)
	g.Expect(out).To(ContainSubstring(ring), "sharder status in the test Pod lists the ring")
}

// testLeaseCollectedWithPod: the garbage collector deletes a Lease owned by
// a deleted pod, and the ring follows: the instance is no longer available,
// and held as vanished (its objects wait: nothing proves that the process
// is gone) until twice its lease duration after its last renewal.
func testLeaseCollectedWithPod(t *testing.T) {
	g := NewWithT(t)
	ctx := t.Context()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: leaseNamespace, Name: instance}}
	g.Expect(k8sClient.Delete(ctx, pod)).To(Succeed())

	g.Eventually(func() error {
		return k8sClient.Get(ctx, client.ObjectKey{Namespace: leaseNamespace, Name: instance}, &coordinationv1.Lease{})
	}).WithTimeout(2*time.Minute).WithPolling(time.Second).Should(Satisfy(apierrors.IsNotFound), "the Lease goes with its pod")

	member := func(g Gomega) sharderv1alpha1.ControllerRingStatus {
		var r sharderv1alpha1.ControllerRing
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Name: ring}, &r)).To(Succeed())
		return r.Status
	}
	// The instance's Lease lasts an hour, so it stays vanished for the rest
	// of the test (the move to dead after two lease durations is tested
	// against a bare API server with short Leases).
	g.Eventually(func(g Gomega) {
		status := member(g)
		g.Expect(status.AvailableInstances).To(BeZero())
		g.Expect(status.Members).To(ConsistOf(And(HaveField("Name", instance), HaveField("State", "vanished"))))
	}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
}

// testUninstall: after helm uninstall, objects of the ring (which the user
// keeps) can be labelled freely again: nothing of the sharder's is left to
// answer for them, or to refuse when it cannot.
func testUninstall(t *testing.T) {
	g := NewWithT(t)
	ctx := t.Context()
	if _, err := helm(ctx, "uninstall", release, "--namespace", sharderNamespace, "--wait", "--timeout", "2m"); err != nil {
		t.Fatal(err)
	}
	g.Eventually(func(g Gomega) {
		g.Expect(podNames(ctx, g, sharderNamespace, "app.kubernetes.io/name=sharder")).To(BeEmpty())
	}).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
	// The ring declared in the values went before the sharder, through the
	// chart's pre-delete hook (its Job completed; the Job itself is deleted
	// then, its events stay), not left terminating under its finalizer.
	g.Eventually(func(g Gomega) {
		out, err := kubectl(ctx, "get", "events", "--namespace", sharderNamespace, "-o", "name", "--field-selector",
			"involvedObject.kind=Job,involvedObject.name="+release+"-uninstall,reason=Completed")
		g.Expect(err).NotTo(HaveOccurred(), out)
		g.Expect(strings.TrimSpace(out)).NotTo(BeEmpty(), "the pre-delete hook's Job never completed")
	}).WithTimeout(30 * time.Second).WithPolling(time.Second).Should(Succeed())
	err := k8sClient.Get(ctx, client.ObjectKey{Name: chartRing}, &sharderv1alpha1.ControllerRing{})
	g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "ControllerRing %s left behind by helm uninstall (get: %v)", chartRing, err)

	// The ring fails closed: a webhook configuration left behind, pointing
	// at the deleted Service, refuses these writes.
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
		Namespace: objectsNamespace, Name: "after-uninstall",
		Labels: map[string]string{sharderv1alpha1.ShardLabel(ring): "someone"},
	}}
	if err := k8sClient.Create(ctx, cm); err != nil {
		t.Errorf("creating a ConfigMap with a shard label after uninstall: %v", err)
	} else {
		patch := client.MergeFrom(cm.DeepCopy())
		cm.Labels[sharderv1alpha1.ShardLabel(ring)] = "someone-else"
		if err := k8sClient.Patch(ctx, cm, patch); err != nil {
			t.Errorf("changing a shard label after uninstall: %v", err)
		}
	}
	err = k8sClient.Get(ctx, client.ObjectKey{Name: release}, &admissionregistrationv1.ValidatingWebhookConfiguration{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("the sharder's ValidatingWebhookConfiguration %q is left behind after uninstall (get: %v)", release, err)
	}
	for _, name := range []string{release + "-leases", release + "-writes"} {
		if err := k8sClient.Get(ctx, client.ObjectKey{Name: name}, &flowcontrolv1.FlowSchema{}); !apierrors.IsNotFound(err) {
			t.Errorf("the FlowSchema %q is left behind after uninstall (get: %v)", name, err)
		}
	}
}

// createRing declares ring "e2e": the ConfigMaps of one namespace, failing
// closed (so that a webhook that cannot answer shows), with the RBAC its
// owner grants the chart's sharder: a ClusterRole aggregated into the
// chart's rings role.
func createRing(ctx context.Context, g Gomega) {
	for _, ns := range []*corev1.Namespace{
		{ObjectMeta: metav1.ObjectMeta{Name: objectsNamespace, Labels: map[string]string{"sharder.dev/e2e": ring}}},
		{ObjectMeta: metav1.ObjectMeta{Name: leaseNamespace}},
	} {
		g.Expect(k8sClient.Create(ctx, ns)).To(Succeed())
	}
	// Aggregated into the chart's rings role: it names no service account.
	g.Expect(k8sClient.Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: ring + ":sharded-resources", Labels: map[string]string{"sharder.dev/aggregate-to-sharder": "true"}},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch", "patch"}}},
	})).To(Succeed())
	g.Expect(k8sClient.Create(ctx, &sharderv1alpha1.ControllerRing{
		ObjectMeta: metav1.ObjectMeta{Name: ring},
		Spec: sharderv1alpha1.ControllerRingSpec{
			LeaseNamespace:    leaseNamespace,
			Resources:         []sharderv1alpha1.RingResource{{Group: "", Resource: "configmaps"}},
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"sharder.dev/e2e": ring}},
			Webhook:           &sharderv1alpha1.RingWebhook{FailurePolicy: ptr.To(admissionregistrationv1.Fail)},
		},
	})).To(Succeed())
}

// waitDefaultServiceAccount waits for the controller manager to create a new
// namespace's default ServiceAccount: pods are refused until then.
func waitDefaultServiceAccount(ctx context.Context, g Gomega, namespace string) {
	g.Eventually(func() error {
		return k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "default"}, &corev1.ServiceAccount{})
	}).WithTimeout(time.Minute).Should(Succeed())
}

// podNames returns the names of the pods matching selector that are not
// being deleted.
func podNames(ctx context.Context, g Gomega, namespace, selector string) []string {
	sel, err := metav1.ParseToLabelSelector(selector)
	g.Expect(err).NotTo(HaveOccurred())
	s, err := metav1.LabelSelectorAsSelector(sel)
	g.Expect(err).NotTo(HaveOccurred())
	var pods corev1.PodList
	g.Expect(k8sClient.List(ctx, &pods, client.InNamespace(namespace), client.MatchingLabelsSelector{Selector: s})).To(Succeed())
	var names []string
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			names = append(names, p.Name)
		}
	}
	return names
}

// row returns the fields of the line of kubectl get's table whose first
// column is name.
func row(table, name string) []string {
	for _, line := range strings.Split(table, "\n") {
		if fields := strings.Fields(line); len(fields) > 0 && fields[0] == name {
			return fields
		}
	}
	return nil
}

// dumpState logs what helps to understand a failure: the pods, recent
// events and the logs of the pods matching selector.
func dumpState(t *testing.T, namespace, selector string) {
	ctx := context.Background()
	for _, args := range [][]string{
		{"get", "pods", "--all-namespaces", "-o", "wide"},
		{"get", "events", "--all-namespaces", "--sort-by=.lastTimestamp"},
		{"logs", "--namespace", namespace, "-l", selector, "--all-containers", "--prefix", "--tail=100"},
	} {
		out, err := kubectl(ctx, args...)
		t.Logf("kubectl %s (%v):\n%s", strings.Join(args, " "), err, out)
	}
	dumpRestarts(ctx, t)
}

// dumpRestarts logs, for every container in the cluster that restarted, how
// its last run ended and the end of that run's log: why a pod exited is
// otherwise gone with it.
func dumpRestarts(ctx context.Context, t *testing.T) {
	var pods corev1.PodList
	if err := k8sClient.List(ctx, &pods); err != nil {
		t.Logf("listing pods for their restarts: %v", err)
		return
	}
	for _, pod := range pods.Items {
		for _, cs := range slices.Concat(pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses) {
			if cs.RestartCount == 0 {
				continue
			}
			ended := "no record of how"
			if term := cs.LastTerminationState.Terminated; term != nil {
				ended = fmt.Sprintf("exit code %d, reason %q, message %q, finished %s",
					term.ExitCode, term.Reason, term.Message, term.FinishedAt.UTC().Format(time.RFC3339))
			}
			out, err := kubectl(ctx, "logs", "--namespace", pod.Namespace, pod.Name, "--container", cs.Name, "--previous", "--tail=60")
			t.Logf("%s/%s container %s restarted %d times; its last run ended: %s; its log (%v):\n%s",
				pod.Namespace, pod.Name, cs.Name, cs.RestartCount, ended, err, out)
		}
	}
}

// By logs a step of a scenario.
func By(t *testing.T, step string) {
	t.Helper()
	t.Logf("STEP: %s", step)
}
