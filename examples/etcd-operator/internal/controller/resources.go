package controller

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	etcdv1alpha1 "github.com/sharder-dev/sharder/examples/etcd-operator/api/v1alpha1"
)

// Labels the operator puts on a cluster's children and pods.
const (
	// LabelCluster names the EtcdCluster a child or member pod belongs to.
	LabelCluster = "etcd.example.sharder.dev/cluster"

	labelAppName   = "app.kubernetes.io/name"
	labelInstance  = "app.kubernetes.io/instance"
	labelManagedBy = "app.kubernetes.io/managed-by"

	// annotationConfigHash on the pod template records the ConfigMap's
	// content a member started with; a member whose pod carries another
	// hash is restarted by the operator, one member at a time.
	annotationConfigHash = "etcd.example.sharder.dev/config-hash"

	// annotationInitialCluster and annotationInitialClusterState are written
	// by the operator on each member pod before it lets the pod start: the
	// member reads them (through the Downward API) as its initial cluster
	// and state. Only a member starting without data uses them.
	annotationInitialCluster      = "etcd.example.sharder.dev/initial-cluster"
	annotationInitialClusterState = "etcd.example.sharder.dev/initial-cluster-state"

	// membershipGate is the scheduling gate every member pod is created
	// with: the pod does not start until the operator has made etcd expect
	// it (added it as a learner, or replaced a member whose data is gone)
	// and written its initial cluster.
	membershipGate = "etcd.example.sharder.dev/membership"

	containerName = "etcd"
	volumeName    = "data"
	managerName   = "etcd-operator"
)

// Default compute resources of the etcd container.
var (
	defaultRequests = corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("100m"),
		corev1.ResourceMemory: resource.MustParse("128Mi"),
	}
	defaultLimits = corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("1"),
		corev1.ResourceMemory: resource.MustParse("1Gi"),
	}
)

// Names of a cluster's children.
func configMapName(c *etcdv1alpha1.EtcdCluster) string     { return c.Name + "-config" }
func peerServiceName(c *etcdv1alpha1.EtcdCluster) string   { return c.Name + "-peer" }
func clientServiceName(c *etcdv1alpha1.EtcdCluster) string { return c.Name + "-client" }
func statefulSetName(c *etcdv1alpha1.EtcdCluster) string   { return c.Name }
func pdbName(c *etcdv1alpha1.EtcdCluster) string           { return c.Name }

// spec returns the cluster's spec with every default the CRD schema would
// apply, so objects built from an object written before a default existed
// (or by a client that skipped defaulting) are still complete.
func spec(c *etcdv1alpha1.EtcdCluster) etcdv1alpha1.EtcdClusterSpec {
	s := *c.Spec.DeepCopy()
	if s.Size == 0 {
		s.Size = etcdv1alpha1.DefaultSize
	}
	if s.Version == "" {
		s.Version = etcdv1alpha1.DefaultVersion
	}
	if s.Repository == "" {
		s.Repository = etcdv1alpha1.DefaultRepository
	}
	if s.Network.ClientPort == 0 {
		s.Network.ClientPort = etcdv1alpha1.DefaultClientPort
	}
	if s.Network.PeerPort == 0 {
		s.Network.PeerPort = etcdv1alpha1.DefaultPeerPort
	}
	if s.Network.ServiceType == "" {
		s.Network.ServiceType = corev1.ServiceTypeClusterIP
	}
	if s.Storage.Size == nil {
		s.Storage.Size = ptr.To(resource.MustParse(etcdv1alpha1.DefaultStorageSize))
	}
	if s.Advanced.DataDir == "" {
		s.Advanced.DataDir = etcdv1alpha1.DefaultDataDir
	}
	s.Resources.Requests = withDefaults(s.Resources.Requests, defaultRequests)
	s.Resources.Limits = withDefaults(s.Resources.Limits, defaultLimits)
	return s
}

func withDefaults(list, defaults corev1.ResourceList) corev1.ResourceList {
	out := corev1.ResourceList{}
	for k, v := range defaults {
		out[k] = v
	}
	for k, v := range list {
		out[k] = v
	}
	return out
}

// selectorLabels select a cluster's member pods.
func selectorLabels(c *etcdv1alpha1.EtcdCluster) map[string]string {
	return map[string]string{labelAppName: "etcd", LabelCluster: c.Name}
}

// commonLabels go on every child of a cluster.
func commonLabels(c *etcdv1alpha1.EtcdCluster) map[string]string {
	l := selectorLabels(c)
	l[labelInstance] = c.Name
	l[labelManagedBy] = managerName
	return l
}

// quorum is the number of members that must be ready for etcd to serve.
func quorum(size int32) int32 { return size/2 + 1 }

// memberName is the name of member i (its pod's name).
func memberName(c *etcdv1alpha1.EtcdCluster, i int32) string {
	return fmt.Sprintf("%s-%d", statefulSetName(c), i)
}

// memberHost is the stable DNS name of member i through the peer Service.
func memberHost(c *etcdv1alpha1.EtcdCluster, i int32) string {
	return fmt.Sprintf("%s.%s.%s.svc", memberName(c, i), peerServiceName(c), c.Namespace)
}

// clientScheme and peerScheme are the URL schemes of a cluster's client and
// peer traffic. Every URL of a member is built with them.
func clientScheme(s etcdv1alpha1.EtcdClusterSpec) string {
	if clientTLS(s) {
		return "https"
	}
	return "http"
}

func peerScheme(s etcdv1alpha1.EtcdClusterSpec) string {
	if peerTLS(s) {
		return "https"
	}
	return "http"
}

func peerURL(c *etcdv1alpha1.EtcdCluster, s etcdv1alpha1.EtcdClusterSpec, i int32) string {
	return fmt.Sprintf("%s://%s:%d", peerScheme(s), memberHost(c, i), s.Network.PeerPort)
}

func clientURL(c *etcdv1alpha1.EtcdCluster, s etcdv1alpha1.EtcdClusterSpec, i int32) string {
	return fmt.Sprintf("%s://%s:%d", clientScheme(s), memberHost(c, i), s.Network.ClientPort)
}

// image is the etcd image of a spec's version.
func image(s etcdv1alpha1.EtcdClusterSpec) string {
	return fmt.Sprintf("%s:v%s", s.Repository, s.Version)
}

// clientEndpoint is the URL of the client Service.
func clientEndpoint(c *etcdv1alpha1.EtcdCluster, s etcdv1alpha1.EtcdClusterSpec) string {
	return fmt.Sprintf("%s://%s.%s.svc:%d", clientScheme(s), clientServiceName(c), c.Namespace, s.Network.ClientPort)
}

// envName turns an etcd flag name into the environment variable etcd reads
// it from: heartbeat-interval -> ETCD_HEARTBEAT_INTERVAL.
func envName(flag string) string {
	return "ETCD_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// configData is the cluster-wide etcd configuration, as environment
// variables the members load from the ConfigMap. Settings that differ per
// member (name, advertised URLs) are in the pod template; the initial
// cluster, which depends on the members etcd has when a member joins, is on
// the member's pod (annotationInitialCluster).
func configData(c *etcdv1alpha1.EtcdCluster, s etcdv1alpha1.EtcdClusterSpec) map[string]string {
	data := map[string]string{}
	for k, v := range s.Advanced.EtcdConfig {
		data[envName(k)] = v
	}
	// The operator's own settings win over etcdConfig (the schema refuses
	// these keys; this keeps an unvalidated object from overriding them).
	delete(data, "ETCD_INITIAL_CLUSTER")
	delete(data, "ETCD_INITIAL_CLUSTER_STATE")
	data["ETCD_INITIAL_CLUSTER_TOKEN"] = c.Namespace + "-" + c.Name + "-" + string(c.UID)
	data["ETCD_DATA_DIR"] = strings.TrimSuffix(s.Advanced.DataDir, "/") + "/data"
	data["ETCD_LISTEN_PEER_URLS"] = fmt.Sprintf("%s://0.0.0.0:%d", peerScheme(s), s.Network.PeerPort)
	data["ETCD_LISTEN_CLIENT_URLS"] = fmt.Sprintf("%s://0.0.0.0:%d", clientScheme(s), s.Network.ClientPort)
	for k, v := range tlsConfigData(s) {
		data[k] = v
	}
	return data
}

// hashData is a stable digest of a ConfigMap's data.
func hashData(data map[string]string) string {
	keys := make([]string, 0, len(data))
	for k := range data {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	h := sha256.New()
	for _, k := range keys {
		fmt.Fprintf(h, "%s=%s\n", k, data[k])
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

func objectMeta(c *etcdv1alpha1.EtcdCluster, name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: c.Namespace, Name: name, Labels: commonLabels(c)}
}

func buildConfigMap(c *etcdv1alpha1.EtcdCluster, s etcdv1alpha1.EtcdClusterSpec) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: objectMeta(c, configMapName(c)), Data: configData(c, s)}
}

func servicePorts(s etcdv1alpha1.EtcdClusterSpec, withPeer bool) []corev1.ServicePort {
	ports := []corev1.ServicePort{{
		Name: "client", Protocol: corev1.ProtocolTCP, Port: s.Network.ClientPort,
		TargetPort: intstr.FromString("client"),
	}}
	if withPeer {
		ports = append(ports, corev1.ServicePort{
			Name: "peer", Protocol: corev1.ProtocolTCP, Port: s.Network.PeerPort,
			TargetPort: intstr.FromString("peer"),
		})
	}
	return ports
}

// buildPeerService is the headless Service giving each member a stable DNS
// name. It publishes members before they are ready: they must find each
// other to become ready at all.
func buildPeerService(c *etcdv1alpha1.EtcdCluster, s etcdv1alpha1.EtcdClusterSpec) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: objectMeta(c, peerServiceName(c)),
		Spec: corev1.ServiceSpec{
			Type:                     corev1.ServiceTypeClusterIP,
			ClusterIP:                corev1.ClusterIPNone,
			Selector:                 selectorLabels(c),
			Ports:                    servicePorts(s, true),
			PublishNotReadyAddresses: true,
		},
	}
}

// buildClientService is the Service clients connect to: ready members only.
func buildClientService(c *etcdv1alpha1.EtcdCluster, s etcdv1alpha1.EtcdClusterSpec) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: objectMeta(c, clientServiceName(c)),
		Spec: corev1.ServiceSpec{
			Type:     s.Network.ServiceType,
			Selector: selectorLabels(c),
			Ports:    servicePorts(s, false),
		},
	}
}

// buildStatefulSet is the cluster's members, replicas of them (the operator
// moves replicas towards the spec's size one member at a time). Pods are
// created in parallel: a member becomes ready only once a quorum runs, so
// ordered start-up would never get past the first pod. Every pod is created
// behind membershipGate, and the update strategy is OnDelete: a change of
// the template restarts no member by itself; the operator deletes outdated
// members one at a time.
func buildStatefulSet(c *etcdv1alpha1.EtcdCluster, s etcdv1alpha1.EtcdClusterSpec, configHash string, replicas int32) *appsv1.StatefulSet {
	host := fmt.Sprintf("$(ETCD_NAME).%s.%s.svc", peerServiceName(c), c.Namespace)
	container := corev1.Container{
		Name:    containerName,
		Image:   image(s),
		Command: []string{"/usr/local/bin/etcd"},
		Ports: []corev1.ContainerPort{
			{Name: "client", ContainerPort: s.Network.ClientPort, Protocol: corev1.ProtocolTCP},
			{Name: "peer", ContainerPort: s.Network.PeerPort, Protocol: corev1.ProtocolTCP},
		},
		EnvFrom: []corev1.EnvFromSource{{
			ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: configMapName(c)}},
		}},
		Env: []corev1.EnvVar{
			{Name: "ETCD_NAME", ValueFrom: &corev1.EnvVarSource{
				FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.name"},
			}},
			{Name: "ETCD_INITIAL_CLUSTER", ValueFrom: &corev1.EnvVarSource{
				FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.annotations['" + annotationInitialCluster + "']"},
			}},
			{Name: "ETCD_INITIAL_CLUSTER_STATE", ValueFrom: &corev1.EnvVarSource{
				FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.annotations['" + annotationInitialClusterState + "']"},
			}},
			{Name: "ETCD_INITIAL_ADVERTISE_PEER_URLS", Value: fmt.Sprintf("%s://%s:%d", peerScheme(s), host, s.Network.PeerPort)},
			{Name: "ETCD_ADVERTISE_CLIENT_URLS", Value: fmt.Sprintf("%s://%s:%d", clientScheme(s), host, s.Network.ClientPort)},
		},
		Resources: corev1.ResourceRequirements{Requests: s.Resources.Requests, Limits: s.Resources.Limits},
		ReadinessProbe: &corev1.Probe{
			ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
				Path: "/health", Port: intstr.FromString("client"), Scheme: corev1.URISchemeHTTP,
			}},
			PeriodSeconds: 5, TimeoutSeconds: 2, SuccessThreshold: 1, FailureThreshold: 3,
		},
		VolumeMounts: []corev1.VolumeMount{{Name: volumeName, MountPath: s.Advanced.DataDir}},
	}
	addTLS(s, &container)
	podLabels := commonLabels(c)
	sts := &appsv1.StatefulSet{
		ObjectMeta: objectMeta(c, statefulSetName(c)),
		Spec: appsv1.StatefulSetSpec{
			Replicas:            ptr.To(replicas),
			ServiceName:         peerServiceName(c),
			Selector:            &metav1.LabelSelector{MatchLabels: selectorLabels(c)},
			PodManagementPolicy: appsv1.ParallelPodManagement,
			UpdateStrategy:      appsv1.StatefulSetUpdateStrategy{Type: appsv1.OnDeleteStatefulSetStrategyType},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{
					Labels:      podLabels,
					Annotations: map[string]string{annotationConfigHash: configHash},
				},
				Spec: corev1.PodSpec{
					SchedulingGates:    []corev1.PodSchedulingGate{{Name: membershipGate}},
					Containers:         []corev1.Container{container},
					ServiceAccountName: s.Advanced.ServiceAccountName,
					NodeSelector:       s.Advanced.NodeSelector,
					Tolerations:        s.Advanced.Tolerations,
					PriorityClassName:  s.Advanced.PriorityClassName,
					Affinity: &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
						// Spread members over nodes when possible: one node
						// failing should cost one member, not the quorum.
						PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{
							Weight: 100,
							PodAffinityTerm: corev1.PodAffinityTerm{
								LabelSelector: &metav1.LabelSelector{MatchLabels: selectorLabels(c)},
								TopologyKey:   corev1.LabelHostname,
							},
						}},
					}},
				},
			},
		},
	}
	sts.Spec.Template.Spec.Volumes = tlsVolumes(c, s)
	if s.Storage.Ephemeral {
		// The data lives and dies with the pod.
		sts.Spec.Template.Spec.Volumes = append(sts.Spec.Template.Spec.Volumes, corev1.Volume{
			Name: volumeName, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}},
		})
		return sts
	}
	sts.Spec.VolumeClaimTemplates = []corev1.PersistentVolumeClaim{{
		ObjectMeta: metav1.ObjectMeta{Name: volumeName, Labels: commonLabels(c)},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: s.Storage.StorageClassName,
			Resources: corev1.VolumeResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceStorage: *s.Storage.Size},
			},
		},
	}}
	return sts
}

// buildPDB keeps voluntary disruptions (drains, evictions) from taking the
// cluster below its quorum. A single member has no quorum to protect: its
// budget allows the disruption rather than blocking node drains forever.
func buildPDB(c *etcdv1alpha1.EtcdCluster, s etcdv1alpha1.EtcdClusterSpec) *policyv1.PodDisruptionBudget {
	minAvailable := quorum(s.Size)
	if s.Size == 1 {
		minAvailable = 0
	}
	return &policyv1.PodDisruptionBudget{
		ObjectMeta: objectMeta(c, pdbName(c)),
		Spec: policyv1.PodDisruptionBudgetSpec{
			MinAvailable: ptr.To(intstr.FromInt32(minAvailable)),
			Selector:     &metav1.LabelSelector{MatchLabels: selectorLabels(c)},
		},
	}
}
