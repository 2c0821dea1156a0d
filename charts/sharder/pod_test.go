package chart_test

import (
	"fmt"
	"testing"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// sharderContainer renders values and returns the Deployment's pod spec and
// its sharder container.
func sharderContainer(t *testing.T, values string) (corev1.PodSpec, corev1.Container) {
	t.Helper()
	_, objs := render(t, values)
	pod := as[appsv1.Deployment](t, find(objs, "Deployment")["sharder"]).Spec.Template.Spec
	return pod, pod.Containers[0]
}

func TestRenderPodDefaults(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	pod, c := sharderContainer(t, "")
	g.Expect(pod.HostNetwork).To(BeFalse())
	g.Expect(pod.DNSPolicy).To(BeEmpty(), "the cluster's default")
	g.Expect(c.StartupProbe).To(BeNil())
	health := corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("health")}}
	g.Expect(c.LivenessProbe).To(Equal(&corev1.Probe{ProbeHandler: health, InitialDelaySeconds: 15, PeriodSeconds: 20}))
	g.Expect(c.ReadinessProbe).To(Equal(&corev1.Probe{
		ProbeHandler:        corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromString("health")}},
		InitialDelaySeconds: 5, PeriodSeconds: 10,
	}))
	names := []string{}
	for _, e := range c.Env {
		names = append(names, e.Name)
	}
	g.Expect(names).To(Equal([]string{"POD_NAME", "POD_NAMESPACE", "SHARDER_MEMORY_LIMIT"}))
	g.Expect(c.Env[2].ValueFrom).To(Equal(&corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{
		ContainerName: "sharder", Resource: "limits.memory"}}), "the Go runtime's soft memory limit follows the container's")
	g.Expect(pod.Volumes).To(HaveLen(2), "config and tmp")
}

func TestRenderPodOptions(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	pod, c := sharderContainer(t, `
env:
  GOMEMLIMIT: 450MiB
  GOGC: 200
extraEnv:
- name: GOMAXPROCS
  valueFrom:
    resourceFieldRef: {resource: limits.cpu}
extraVolumes:
- name: ca
  configMap: {name: trusted-ca}
extraVolumeMounts:
- {name: ca, mountPath: /etc/ssl/certs/extra, readOnly: true}
livenessProbe:
  periodSeconds: 30
  failureThreshold: 5
readinessProbe:
  timeoutSeconds: 3
startupProbe:
  enabled: true
  periodSeconds: 2
  failureThreshold: 90
`)
	g.Expect(c.Env).To(ContainElements(
		corev1.EnvVar{Name: "GOMEMLIMIT", Value: "450MiB"},
		corev1.EnvVar{Name: "GOGC", Value: "200"},
		corev1.EnvVar{Name: "GOMAXPROCS", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.cpu"}}},
	))
	g.Expect(c.Env[:2]).To(HaveEach(HaveField("ValueFrom.FieldRef", Not(BeNil()))), "the downward API variables come first")
	g.Expect(pod.Volumes).To(ContainElement(corev1.Volume{Name: "ca",
		VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "trusted-ca"}}}}))
	g.Expect(c.VolumeMounts).To(ContainElement(corev1.VolumeMount{Name: "ca", MountPath: "/etc/ssl/certs/extra", ReadOnly: true}))

	g.Expect(c.LivenessProbe.PeriodSeconds).To(BeEquivalentTo(30))
	g.Expect(c.LivenessProbe.FailureThreshold).To(BeEquivalentTo(5))
	g.Expect(c.LivenessProbe.InitialDelaySeconds).To(BeEquivalentTo(15), "keys not given keep their defaults")
	g.Expect(c.LivenessProbe.HTTPGet.Path).To(Equal("/healthz"), "the handler stays the chart's")
	g.Expect(c.ReadinessProbe.TimeoutSeconds).To(BeEquivalentTo(3))
	g.Expect(c.ReadinessProbe.HTTPGet.Path).To(Equal("/readyz"))
	g.Expect(c.StartupProbe).To(Equal(&corev1.Probe{
		ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("health")}},
		PeriodSeconds: 2, FailureThreshold: 90,
	}))
}

// TestRenderHostNetwork: on the node's network the pod resolves cluster
// names, and listens on the ports the values name.
func TestRenderHostNetwork(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	_, objs := render(t, `
hostNetwork: true
webhook:
  port: 19443
health:
  port: 18081
metrics:
  port: 18443
`)
	pod := as[appsv1.Deployment](t, find(objs, "Deployment")["sharder"]).Spec.Template.Spec
	g.Expect(pod.HostNetwork).To(BeTrue())
	g.Expect(pod.DNSPolicy).To(Equal(corev1.DNSClusterFirstWithHostNet))
	ports := map[string]int32{}
	for _, p := range pod.Containers[0].Ports {
		ports[p.Name] = p.ContainerPort
	}
	g.Expect(ports).To(Equal(map[string]int32{"webhook": 19443, "health": 18081, "metrics": 18443}))
	cfg := sharderConfig(t, objs)
	g.Expect(cfg.Webhook.Port).To(Equal(19443))
	g.Expect(cfg.Health.BindAddress).To(Equal(":18081"))
	g.Expect(cfg.Metrics.BindAddress).To(Equal(":18443"))
	// The Services reach the pods by port name, whatever the number.
	svc := as[corev1.Service](t, find(objs, "Service")["sharder-webhook"])
	g.Expect(svc.Spec.Ports[0].TargetPort).To(Equal(intstr.FromString("webhook")))
}

func TestRenderAggregatedClusterRoles(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	_, objs := render(t, "")
	roles := find(objs, "ClusterRole")
	view := as[rbacv1.ClusterRole](t, roles["sharder-view"])
	edit := as[rbacv1.ClusterRole](t, roles["sharder-edit"])
	const aggregate = "rbac.authorization.k8s.io/aggregate-to-"
	g.Expect(view.Labels).To(And(HaveKeyWithValue(aggregate+"view", "true"), HaveKeyWithValue(aggregate+"edit", "true"),
		HaveKeyWithValue(aggregate+"admin", "true")))
	g.Expect(edit.Labels).To(And(HaveKeyWithValue(aggregate+"edit", "true"), HaveKeyWithValue(aggregate+"admin", "true")))
	g.Expect(edit.Labels).NotTo(HaveKey(aggregate+"view"), "viewers must not change rings")
	g.Expect(permissions(view.Rules)).To(Equal([]string{
		"sharder.dev/controllerrings:get", "sharder.dev/controllerrings:list", "sharder.dev/controllerrings:watch",
	}))
	g.Expect(permissions(edit.Rules)).To(Equal([]string{
		"sharder.dev/controllerrings:create", "sharder.dev/controllerrings:delete",
		"sharder.dev/controllerrings:patch", "sharder.dev/controllerrings:update",
	}))
	// Nobody gains the status through the user-facing roles: it is the sharder's.
	for _, r := range append(view.Rules, edit.Rules...) {
		g.Expect(r.Resources).NotTo(ContainElement("controllerrings/status"))
	}

	_, objs = render(t, "rbac:\n  aggregateClusterRoles: false\n")
	g.Expect(find(objs, "ClusterRole")).NotTo(HaveKey("sharder-view"))
	g.Expect(find(objs, "ClusterRole")).NotTo(HaveKey("sharder-edit"))
	g.Expect(find(objs, "ClusterRole")).To(HaveKey("sharder"))
}

// TestRenderHelmTest: the Pod helm test runs is a hook, calls the webhook
// Service with `sharder probe` and then runs `sharder status`, with the
// chart's image and ServiceAccount under the same restrictions as the
// sharder, and is none of the sharder's pods.
func TestRenderHelmTest(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	_, objs := render(t, "")
	test := as[corev1.Pod](t, find(objs, "Pod")["sharder-test-status"])
	g.Expect(test.Annotations).To(HaveKeyWithValue("helm.sh/hook", "test"))
	g.Expect(test.Spec.RestartPolicy).To(Equal(corev1.RestartPolicyNever))

	dep := as[appsv1.Deployment](t, find(objs, "Deployment")["sharder"])
	sharder := dep.Spec.Template.Spec
	g.Expect(test.Spec.ServiceAccountName).To(Equal(sharder.ServiceAccountName))
	g.Expect(test.Spec.SecurityContext).To(Equal(sharder.SecurityContext))
	g.Expect(test.Spec.Containers).To(HaveLen(1))
	g.Expect(test.Spec.InitContainers).To(HaveLen(1))
	for _, c := range append(test.Spec.InitContainers, test.Spec.Containers...) {
		g.Expect(c.Image).To(Equal(sharder.Containers[0].Image), "no image beyond the chart's")
		g.Expect(c.SecurityContext).To(Equal(sharder.Containers[0].SecurityContext))
		g.Expect(c.SecurityContext.ReadOnlyRootFilesystem).To(Equal(ptr.To(true)))
	}
	selected := true
	for k, v := range dep.Spec.Selector.MatchLabels {
		selected = selected && test.Labels[k] == v
	}
	g.Expect(selected).To(BeFalse(), "the test Pod must not match the sharder's selector")

	// First the webhook, at the Service's name and port, against the CA of
	// the webhook's Secret (its certificate only).
	cfg := sharderConfig(t, objs)
	probe := test.Spec.InitContainers[0]
	g.Expect(probe.Args).To(Equal([]string{"probe", "--ca-file=/etc/sharder/webhook-ca/ca.crt", "--timeout=2m",
		fmt.Sprintf("https://%s.%s.svc:%d/", cfg.Webhook.ServiceName, namespace, cfg.Webhook.ServicePort)}))
	g.Expect(probe.VolumeMounts).To(Equal([]corev1.VolumeMount{{Name: "webhook-ca", MountPath: "/etc/sharder/webhook-ca", ReadOnly: true}}))
	g.Expect(test.Spec.Volumes).To(Equal([]corev1.Volume{{Name: "webhook-ca", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
		SecretName: cfg.Webhook.SecretName, Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}},
	}}}}))
	// Then the rings. The sharder's ClusterRole lets `sharder status` read
	// them and their Leases.
	g.Expect(test.Spec.Containers[0].Args).To(Equal([]string{"status"}))
	role := as[rbacv1.ClusterRole](t, find(objs, "ClusterRole")["sharder"])
	g.Expect(permissions(role.Rules)).To(ContainElements("sharder.dev/controllerrings:list", "coordination.k8s.io/leases:list"))

	// cert-manager's Secret holds the CA of its certificate.
	_, objs = render(t, "webhook:\n  certificates:\n    mode: cert-manager\n")
	test = as[corev1.Pod](t, find(objs, "Pod")["sharder-test-status"])
	secretName, _, _ := unstructured.NestedString(find(objs, "Certificate")["sharder-webhook"].Object, "spec", "secretName")
	g.Expect(test.Spec.Volumes[0].Secret.SecretName).To(Equal(secretName))

	// Without the webhook, the status only.
	_, objs = render(t, "webhook:\n  enabled: false\n")
	test = as[corev1.Pod](t, find(objs, "Pod")["sharder-test-status"])
	g.Expect(test.Spec.InitContainers).To(BeEmpty())
	g.Expect(test.Spec.Volumes).To(BeEmpty())

	_, objs = render(t, "tests:\n  enabled: false\n")
	g.Expect(find(objs, "Pod")).To(BeEmpty())
}
