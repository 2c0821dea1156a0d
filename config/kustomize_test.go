// Package config_test checks the kustomize bases: they build, and what they
// build is accepted by a real API server (server-side dry-run).
package config_test

import (
	"context"
	"os"
	"testing"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/sharder-dev/sharder/internal/testenv"
	"github.com/sharder-dev/sharder/pkg/sharder/config"
)

var suite testenv.Suite // the control plane, started for the first test that calls env

func env() *testenv.Env { return suite.Env() }

func TestMain(m *testing.M) {
	os.Exit(testenv.Run(m, &suite, testenv.Options{CRDDirectoryPaths: []string{"config/crd/bases"}}))
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

func ensureNamespace(t *testing.T, name string) {
	t.Helper()
	err := env().Client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("creating namespace %s: %v", name, err)
	}
}

func TestDefaultOverlayDryRun(t *testing.T) {
	g := NewWithT(t)
	manifests, objs := build(t, "default")
	kinds := map[string]int{}
	for _, o := range objs {
		kinds[o.GetKind()]++
		if o.GetKind() != "Namespace" && o.GetNamespace() != "" {
			g.Expect(o.GetNamespace()).To(Equal("sharder-system"), "%s %s", o.GetKind(), o.GetName())
		}
	}
	g.Expect(kinds).To(HaveKeyWithValue("CustomResourceDefinition", 1))
	g.Expect(kinds).To(HaveKeyWithValue("Deployment", 1))
	g.Expect(kinds).To(HaveKeyWithValue("PodDisruptionBudget", 1))
	g.Expect(kinds).To(HaveKeyWithValue("Service", 2))
	g.Expect(kinds).To(HaveKey("ClusterRole"))
	// API priority and fairness: cluster-scoped, though kustomize does not
	// know it (config/default/cluster_scoped.yaml).
	g.Expect(kinds).To(HaveKeyWithValue("FlowSchema", 2))
	g.Expect(kinds).To(HaveKeyWithValue("PriorityLevelConfiguration", 1))
	for _, o := range objs {
		if o.GetObjectKind().GroupVersionKind().Group == "flowcontrol.apiserver.k8s.io" {
			g.Expect(o.GetNamespace()).To(BeEmpty(), "%s %s", o.GetKind(), o.GetName())
		}
	}

	// Objects in a namespace need it to exist even for a dry-run.
	ensureNamespace(t, "sharder-system")
	out := kubectl(t, manifests, "apply", "--server-side", "--dry-run=server", "--field-manager=test", "-f", "-")
	g.Expect(string(out)).To(ContainSubstring("deployment.apps/sharder serverside-applied (server dry run)"))
	g.Expect(string(out)).To(ContainSubstring("flowschema.flowcontrol.apiserver.k8s.io/sharder-leases serverside-applied (server dry run)"))
}

func TestDefaultOverlayDeployment(t *testing.T) {
	g := NewWithT(t)
	_, objs := build(t, "default")
	var dep appsv1.Deployment
	var configMap corev1.ConfigMap
	for _, o := range objs {
		switch o.GetKind() {
		case "Deployment":
			data, _ := yaml.Marshal(o.Object)
			g.Expect(yaml.UnmarshalStrict(data, &dep)).To(Succeed())
		case "ConfigMap":
			data, _ := yaml.Marshal(o.Object)
			g.Expect(yaml.UnmarshalStrict(data, &configMap)).To(Succeed())
		}
	}
	g.Expect(dep.Spec.Replicas).To(HaveValue(BeEquivalentTo(2)))
	pod := dep.Spec.Template.Spec
	g.Expect(pod.SecurityContext.RunAsNonRoot).To(HaveValue(BeTrue()))
	g.Expect(pod.TopologySpreadConstraints).NotTo(BeEmpty())
	c := pod.Containers[0]
	g.Expect(c.SecurityContext.ReadOnlyRootFilesystem).To(HaveValue(BeTrue()))
	g.Expect(c.SecurityContext.AllowPrivilegeEscalation).To(HaveValue(BeFalse()))
	g.Expect(c.Resources.Requests).To(HaveKey(corev1.ResourceCPU))
	g.Expect(c.ReadinessProbe.HTTPGet.Path).To(Equal("/readyz"))
	g.Expect(c.LivenessProbe.HTTPGet.Path).To(Equal("/healthz"))

	// The shipped configuration file is valid and matches the ports.
	cfg := config.Default()
	g.Expect(config.Load([]byte(configMap.Data["config.yaml"]), cfg)).To(Succeed())
	g.Expect(cfg.Validate()).To(Succeed())
	g.Expect(*cfg).To(Equal(*config.Default()), "the shipped file spells out the defaults")
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	g.Expect(ports).To(HaveKeyWithValue("webhook", int32(cfg.Webhook.Port)))
	g.Expect(ports).To(HaveKeyWithValue("health", int32(8081)))
	g.Expect(ports).To(HaveKeyWithValue("metrics", int32(8443)))
	g.Expect(pod.TerminationGracePeriodSeconds).To(HaveValue(BeNumerically(">", cfg.ShutdownTimeout.Seconds())))
}

func TestSamplesDryRun(t *testing.T) {
	g := NewWithT(t)
	manifests, objs := build(t, "samples")
	g.Expect(objs).To(HaveLen(2), "the ring and its ClusterRole, aggregated into the sharder's rings role")
	out := kubectl(t, manifests, "apply", "--server-side", "--dry-run=server", "--field-manager=test", "-f", "-")
	g.Expect(string(out)).To(ContainSubstring("controllerring.sharder.dev/etcd-operator serverside-applied (server dry run)"))
}

// TestPlainControllerExample: e2e/plaincontroller/config, the example of a
// controller run with `sharder agent`, is accepted by the API server, and
// its pods run the agent as a native sidecar that holds the Lease of the
// ring's instance named after the pod, asking the controller's health
// endpoint, while the controller selects that instance's objects.
func TestPlainControllerExample(t *testing.T) {
	g := NewWithT(t)
	manifests, objs := build(t, "../e2e/plaincontroller/config")
	var ring struct {
		Metadata metav1.ObjectMeta `json:"metadata"`
		Spec     struct {
			LeaseNamespace string `json:"leaseNamespace"`
		} `json:"spec"`
	}
	var sts appsv1.StatefulSet
	for _, o := range objs {
		data, err := yaml.Marshal(o.Object)
		g.Expect(err).NotTo(HaveOccurred())
		switch o.GetKind() {
		case "ControllerRing":
			g.Expect(yaml.Unmarshal(data, &ring)).To(Succeed())
		case "StatefulSet":
			g.Expect(yaml.Unmarshal(data, &sts)).To(Succeed())
		}
	}
	g.Expect(ring.Metadata.Name).NotTo(BeEmpty(), "the example declares its ring")
	pod := sts.Spec.Template.Spec
	g.Expect(sts.Namespace).To(Equal(ring.Spec.LeaseNamespace), "the instances run where their Leases are")
	g.Expect(pod.InitContainers).To(HaveLen(1))
	agent := pod.InitContainers[0]
	g.Expect(agent.RestartPolicy).To(HaveValue(Equal(corev1.ContainerRestartPolicyAlways)), "a native sidecar")
	g.Expect(agent.Args).To(ContainElements("agent", "--ring="+ring.Metadata.Name, "--lease-namespace="+ring.Spec.LeaseNamespace,
		"--health-url=http://localhost:8081/healthz"))
	g.Expect(agent.Env).To(ContainElements(HaveField("Name", "POD_NAME"), HaveField("Name", "POD_UID")))
	g.Expect(agent.Args).To(ContainElement("--health-probe-bind-address=:8082"))
	g.Expect(agent.ReadinessProbe).NotTo(BeNil(), "the pod is Ready while the agent holds the Lease")
	g.Expect(agent.ReadinessProbe.HTTPGet).To(HaveField("Path", "/readyz"))
	g.Expect(pod.Containers).To(HaveLen(1))
	controller := pod.Containers[0]
	g.Expect(controller.Args).To(ContainElements("--selector=shard.sharder.dev/"+ring.Metadata.Name+"=$(POD_NAME)", "--health-probe-bind-address=:8081"))
	g.Expect(controller.Env).To(ContainElement(HaveField("Name", "POD_NAME")), "$(POD_NAME) in the selector needs it")
	g.Expect(pod.TerminationGracePeriodSeconds).NotTo(BeNil())

	for _, ns := range []string{"plaincontroller-system", "plaincontroller-objects"} {
		err := env().Client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	out := kubectl(t, manifests, "apply", "--server-side", "--dry-run=server", "--field-manager=test", "-f", "-")
	g.Expect(string(out)).To(ContainSubstring("controllerring.sharder.dev/" + ring.Metadata.Name + " serverside-applied (server dry run)"))
	g.Expect(string(out)).To(ContainSubstring("statefulset.apps/" + sts.Name + " serverside-applied (server dry run)"))
}

// TestShellControllerExample: examples/shell-controller/config, a controller
// in POSIX shell run with `sharder agent`, is accepted by the API server; its
// pods run the agent as a native sidecar holding the Lease of the instance
// named after the pod, asking the script's health endpoint, and the script
// is told its ring and its instance ID.
func TestShellControllerExample(t *testing.T) {
	g := NewWithT(t)
	manifests, objs := build(t, "../examples/shell-controller/config")
	var sts appsv1.StatefulSet
	var ring, leaseNamespace string
	for _, o := range objs {
		switch o.GetKind() {
		case "ControllerRing":
			ring = o.GetName()
			leaseNamespace, _, _ = unstructured.NestedString(o.Object, "spec", "leaseNamespace")
		case "StatefulSet":
			data, err := yaml.Marshal(o.Object)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(yaml.Unmarshal(data, &sts)).To(Succeed())
		}
	}
	g.Expect(ring).NotTo(BeEmpty(), "the example declares its ring")
	g.Expect(sts.Namespace).To(Equal(leaseNamespace), "the instances run where their Leases are")
	pod := sts.Spec.Template.Spec
	g.Expect(pod.InitContainers).To(HaveLen(1))
	agent := pod.InitContainers[0]
	g.Expect(agent.RestartPolicy).To(HaveValue(Equal(corev1.ContainerRestartPolicyAlways)), "a native sidecar")
	g.Expect(agent.Args).To(ContainElements("agent", "--ring="+ring, "--lease-namespace="+leaseNamespace,
		"--health-url=http://localhost:8081/healthz", "--health-probe-bind-address=:8082"))
	g.Expect(agent.Env).To(ContainElements(HaveField("Name", "POD_NAME"), HaveField("Name", "POD_UID")))
	g.Expect(pod.Containers).To(HaveLen(1))
	controller := pod.Containers[0]
	g.Expect(controller.Args).To(ContainElements("--ring="+ring, "--health-address=8081"))
	g.Expect(controller.Env).To(ContainElement(HaveField("Name", "POD_NAME")), "the script's instance ID")
	g.Expect(controller.VolumeMounts).To(ContainElement(HaveField("MountPath", "/tmp")), "the script writes under /tmp; the root file system is read-only")

	for _, ns := range []string{"shell-controller-system", "shell-controller-objects"} {
		ensureNamespace(t, ns)
	}
	out := kubectl(t, manifests, "apply", "--server-side", "--dry-run=server", "--field-manager=test", "-f", "-")
	g.Expect(string(out)).To(ContainSubstring("controllerring.sharder.dev/" + ring + " serverside-applied (server dry run)"))
	g.Expect(string(out)).To(ContainSubstring("statefulset.apps/" + sts.Name + " serverside-applied (server dry run)"))
}

// TestRingResourceWithoutGroup: a ring written in YAML names a core
// resource without its (optional) group. The API server accepts it, and
// still refuses a resource listed twice, with or without the group.
func TestRingResourceWithoutGroup(t *testing.T) {
	g := NewWithT(t)
	create := func(name string, resources ...map[string]any) error {
		list := make([]any, len(resources))
		for i, r := range resources {
			list[i] = r
		}
		ring := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "sharder.dev/v1alpha1",
			"kind":       "ControllerRing",
			"metadata":   map[string]any{"name": name},
			"spec":       map[string]any{"leaseNamespace": "default", "resources": list},
		}}
		return env().Client.Create(context.Background(), ring, client.DryRunAll)
	}
	secrets := map[string]any{"resource": "secrets"}
	g.Expect(create("core-without-group", secrets, map[string]any{"group": "apps", "resource": "statefulsets"})).To(Succeed())
	for name, twice := range map[string]map[string]any{
		"twice-without-group": secrets,
		"twice-mixed":         {"group": "", "resource": "secrets"},
	} {
		err := create(name, secrets, twice)
		g.Expect(err).To(MatchError(ContainSubstring("a resource is listed more than once in spec.resources")), name)
	}
}
