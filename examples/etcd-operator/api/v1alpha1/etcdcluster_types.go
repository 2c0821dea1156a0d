package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Defaults of EtcdClusterSpec fields, also written into the CRD schema.
const (
	DefaultSize       = 3
	DefaultVersion    = "3.6.8"
	DefaultRepository = "gcr.io/etcd-development/etcd"
	DefaultClientPort = 2379
	DefaultPeerPort   = 2380
	DefaultDataDir    = "/var/lib/etcd"
	// DefaultStorageSize is the size of each member's volume.
	DefaultStorageSize = "10Gi"
	// MaxSize is the largest size.
	MaxSize = 9
)

// EtcdClusterSpec is the desired state of an etcd cluster.
// +kubebuilder:validation:XValidation:rule="(has(self.security) && has(self.security.tls)) == (has(oldSelf.security) && has(oldSelf.security.tls))",message="TLS cannot be turned on or off for an existing cluster"
// +kubebuilder:validation:XValidation:rule="!(has(oldSelf.security) && has(oldSelf.security.auth) && oldSelf.security.auth.enabled) || (has(self.security) && has(self.security.auth) && self.security.auth.enabled)",message="authentication cannot be turned off once on"
// +kubebuilder:validation:XValidation:rule="!(has(self.security) && has(self.security.tls) && self.security.tls.client) || !has(self.network) || ((!has(self.network.clientPort) || self.network.clientPort != 2381) && (!has(self.network.peerPort) || self.network.peerPort != 2381))",message="with client TLS, port 2381 serves /health and metrics: clientPort and peerPort must not be 2381"
type EtcdClusterSpec struct {
	// Size is the number of members: odd (an even number tolerates no more
	// failures than one member fewer) and between 1 and 9. A cluster of 3 or
	// more members cannot be shrunk below 3.
	// Default: 3.
	// +optional
	// +kubebuilder:default=3
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=9
	// +kubebuilder:validation:XValidation:rule="self % 2 == 1",message="size must be odd: 1, 3, 5, 7 or 9"
	// +kubebuilder:validation:XValidation:rule="self >= 3 || oldSelf < 3",message="a cluster of 3 or more members cannot be shrunk below 3 members"
	Size int32 `json:"size,omitempty"`

	// Version is the etcd release, 3.<minor>.<patch>, without a leading "v".
	// It can be raised, never lowered, and by one minor release at a time
	// (etcd upgrades a cluster one minor release at a time). Raising it
	// restarts the members one at a time on the new image.
	// Default: 3.6.8.
	// +optional
	// +kubebuilder:default="3.6.8"
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^3\.[0-9]+\.[0-9]+$`
	// +kubebuilder:validation:XValidation:rule="!isSemver(self) || !isSemver(oldSelf) || semver(self).compareTo(semver(oldSelf)) >= 0",message="version cannot be downgraded"
	// +kubebuilder:validation:XValidation:rule="!isSemver(self) || !isSemver(oldSelf) || semver(self).minor() <= semver(oldSelf).minor() + 1",message="version can be raised by one minor release at a time"
	Version string `json:"version,omitempty"`

	// Repository is the image repository; the image is <repository>:v<version>.
	// Default: gcr.io/etcd-development/etcd.
	// +optional
	// +kubebuilder:default="gcr.io/etcd-development/etcd"
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Repository string `json:"repository,omitempty"`

	// Storage configures each member's data volume. It cannot be changed
	// once the cluster exists (a StatefulSet's volume claims are immutable).
	// +optional
	// +kubebuilder:default={}
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="storage cannot be changed after creation"
	Storage EtcdStorageSpec `json:"storage,omitempty"`

	// Network configures ports and the client Service.
	// +optional
	// +kubebuilder:default={clientPort: 2379, peerPort: 2380, serviceType: "ClusterIP"}
	Network EtcdNetworkSpec `json:"network,omitempty"`

	// Security configures TLS and authentication (see EtcdSecuritySpec).
	// +optional
	Security EtcdSecuritySpec `json:"security,omitempty"`

	// Resources of the etcd container.
	// Default: requests cpu 100m and memory 128Mi, limits cpu 1 and memory 1Gi,
	// each applied when the map does not name the resource.
	// +optional
	Resources EtcdResourceSpec `json:"resources,omitempty"`

	// Advanced holds scheduling and etcd settings most clusters leave alone.
	// +optional
	Advanced EtcdAdvancedSpec `json:"advanced,omitempty"`
}

// EtcdStorageSpec configures the members' data volumes.
type EtcdStorageSpec struct {
	// Ephemeral puts each member's data on an emptyDir volume instead of a
	// volume claim: the data goes with the pod, and a member whose pod is
	// replaced comes back empty. For tests and demos, or clusters without
	// a volume provisioner; StorageClassName and Size are then ignored.
	// +optional
	Ephemeral bool `json:"ephemeral,omitempty"`

	// StorageClassName of the volume claims.
	// Default: the cluster's default storage class.
	// +optional
	StorageClassName *string `json:"storageClassName,omitempty"`

	// Size of each member's volume.
	// Default: 10Gi.
	// +optional
	// +kubebuilder:default="10Gi"
	Size *resource.Quantity `json:"size,omitempty"`
}

// EtcdNetworkSpec configures the members' ports and the client Service.
// +kubebuilder:validation:XValidation:rule="self.clientPort != self.peerPort",message="clientPort and peerPort must differ"
// +kubebuilder:validation:XValidation:rule="self.peerPort == oldSelf.peerPort",message="peerPort cannot be changed: members advertise it to each other"
type EtcdNetworkSpec struct {
	// ClientPort serves clients.
	// Default: 2379.
	// +optional
	// +kubebuilder:default=2379
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	ClientPort int32 `json:"clientPort,omitempty"`

	// PeerPort serves the other members.
	// Default: 2380.
	// +optional
	// +kubebuilder:default=2380
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	PeerPort int32 `json:"peerPort,omitempty"`

	// ServiceType is the type of the client Service.
	// Default: ClusterIP.
	// +optional
	// +kubebuilder:default=ClusterIP
	// +kubebuilder:validation:Enum=ClusterIP;NodePort;LoadBalancer
	ServiceType corev1.ServiceType `json:"serviceType,omitempty"`
}

// EtcdResourceSpec is the compute resources of the etcd container.
type EtcdResourceSpec struct {
	// Requests; cpu and memory get defaults when absent.
	// +optional
	Requests corev1.ResourceList `json:"requests,omitempty"`
	// Limits; cpu and memory get defaults when absent.
	// +optional
	Limits corev1.ResourceList `json:"limits,omitempty"`
}

// EtcdAdvancedSpec holds scheduling and etcd settings.
type EtcdAdvancedSpec struct {
	// ServiceAccountName runs the members under this ServiceAccount.
	// Default: the namespace's default ServiceAccount.
	// +optional
	ServiceAccountName string `json:"serviceAccountName,omitempty"`

	// NodeSelector constrains the nodes members run on.
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`

	// Tolerations of the members' pods.
	// +optional
	// +listType=atomic
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`

	// PriorityClassName of the members' pods.
	// +optional
	PriorityClassName string `json:"priorityClassName,omitempty"`

	// EtcdConfig passes further etcd flags by name without the leading
	// dashes, e.g. {"heartbeat-interval": "200"}. Flags the operator sets
	// itself (name, data directory, URLs, initial cluster) are refused.
	// +optional
	// +kubebuilder:validation:MaxProperties=64
	// +kubebuilder:validation:XValidation:rule="self.all(k, k.matches('^[a-z][a-z0-9-]*$') && k.size() <= 63)",message="etcdConfig keys are etcd flag names in lower case without leading dashes"
	// +kubebuilder:validation:XValidation:rule="self.all(k, !(k in ['name', 'data-dir', 'wal-dir', 'listen-client-urls', 'listen-peer-urls', 'advertise-client-urls', 'initial-advertise-peer-urls', 'initial-cluster', 'initial-cluster-state', 'initial-cluster-token']))",message="etcdConfig cannot set flags the operator manages: name, data-dir, wal-dir, listen-*-urls, advertise-client-urls, initial-*"
	EtcdConfig map[string]string `json:"etcdConfig,omitempty"`

	// DataDir is the data directory inside the container, on the volume.
	// Default: /var/lib/etcd.
	// +optional
	// +kubebuilder:validation:Pattern=`^/[^\s]*$`
	// +kubebuilder:validation:MaxLength=253
	DataDir string `json:"dataDir,omitempty"`
}

// EtcdClusterPhase is where a cluster is in its life cycle.
// +kubebuilder:validation:Enum=Creating;Running;Scaling;Upgrading;Failed;Deleting
type EtcdClusterPhase string

// Phases.
const (
	// EtcdClusterPhaseCreating: the cluster's objects exist or are being
	// created, and etcd has not yet answered with every member healthy and
	// every member pod ready.
	EtcdClusterPhaseCreating EtcdClusterPhase = "Creating"
	// EtcdClusterPhaseRunning: etcd answered with a leader and exactly the
	// desired voting members, each healthy, and every member pod was ready;
	// the cluster stays Running while etcd answers with a leader and a
	// quorum of healthy, ready members.
	EtcdClusterPhaseRunning EtcdClusterPhase = "Running"
	// EtcdClusterPhaseScaling: a cluster that ran is adding or removing
	// members, one at a time (to a new size, or replacing a member whose
	// data was lost); the Progressing condition says which step runs.
	EtcdClusterPhaseScaling EtcdClusterPhase = "Scaling"
	// EtcdClusterPhaseUpgrading: a cluster that ran is restarting its
	// members on a new version, one at a time.
	EtcdClusterPhaseUpgrading EtcdClusterPhase = "Upgrading"
	// EtcdClusterPhaseFailed: an object of the cluster could not be created
	// or updated, or a running cluster lost its quorum (etcd no longer
	// answers with a leader, or fewer than a quorum of members are healthy). The operator keeps
	// retrying and leaves Failed on its own once the cause is gone.
	EtcdClusterPhaseFailed EtcdClusterPhase = "Failed"
	// EtcdClusterPhaseDeleting: the cluster is being deleted; its objects are
	// removed before the finalizer is.
	EtcdClusterPhaseDeleting EtcdClusterPhase = "Deleting"
)

// Condition types of an EtcdCluster.
const (
	// ConditionResourcesReady is True when every object of the cluster
	// (ConfigMap, Services, StatefulSet, PodDisruptionBudget) matches the spec.
	ConditionResourcesReady = "ResourcesReady"
	// ConditionAvailable is True when etcd answers with a leader and a
	// quorum of members is healthy and ready.
	ConditionAvailable = "Available"
	// ConditionReady is True when etcd lists exactly the desired voting
	// members and every one of them is healthy and ready.
	ConditionReady = "Ready"
	// ConditionProgressing is True while the operator changes the
	// membership (adds, promotes, removes or restarts a member) or waits to
	// do so; its reason and message name the step. False with
	// MembersStable when there is nothing to do.
	ConditionProgressing = "Progressing"
)

// Condition reasons of an EtcdCluster; the phase Failed carries one of the
// failure reasons in Ready's reason as well.
const (
	ReasonReconciled       = "Reconciled"
	ReasonResourceConflict = "ResourceConflict"
	ReasonResourceRejected = "ResourceRejected"
	ReasonMembersReady     = "MembersReady"
	ReasonMembersNotReady  = "MembersNotReady"
	ReasonQuorumLost       = "QuorumLost"
	ReasonQuorumReady      = "QuorumReady"
	// ReasonEtcdUnreachable: no member answered the operator (or none has
	// an address yet), or etcd has no leader.
	ReasonEtcdUnreachable = "EtcdUnreachable"
	// ReasonMembersMismatch: etcd lists other voting members than the spec
	// asks for (while scaling, or members the operator did not add).
	ReasonMembersMismatch = "MembersMismatch"
	ReasonDeleting        = "Deleting"
)

// Reasons of the Progressing condition, and of the events of its steps.
const (
	ReasonMembersStable            = "MembersStable"
	ReasonBootstrapping            = "Bootstrapping"
	ReasonAddingLearner            = "AddingLearner"
	ReasonStartingMember           = "StartingMember"
	ReasonPromotingLearner         = "PromotingLearner"
	ReasonRemovingMember           = "RemovingMember"
	ReasonMovingLeader             = "MovingLeader"
	ReasonReplacingMember          = "ReplacingMember"
	ReasonRestartingMember         = "RestartingMember"
	ReasonWaitingForHealthyMembers = "WaitingForHealthyMembers"
	ReasonWaitingForQuorum         = "WaitingForQuorum"
)

// EtcdMember is one member of a cluster: a pod of its StatefulSet.
type EtcdMember struct {
	// Name is the member's (and its pod's) name, <cluster>-<ordinal>.
	Name string `json:"name"`
	// PeerURL is where the other members reach it.
	// +optional
	PeerURL string `json:"peerURL,omitempty"`
	// ClientURL is where clients reach it directly.
	// +optional
	ClientURL string `json:"clientURL,omitempty"`
	// Ready is true when its pod reports Ready (its etcd answers /health).
	Ready bool `json:"ready"`
	// ID is the member's ID in etcd (hexadecimal), once etcd lists it.
	// +optional
	ID string `json:"id,omitempty"`
	// IsLearner is true while etcd lists the member as a learner (not
	// voting).
	// +optional
	IsLearner bool `json:"isLearner,omitempty"`
	// Healthy is true when the member itself answered the operator's
	// status request, in the cluster etcd reports, without errors.
	Healthy bool `json:"healthy"`
	// Version is the etcd version the member reported, when healthy.
	// +optional
	Version string `json:"version,omitempty"`
}

// EtcdClusterStatus is the observed state of an etcd cluster.
type EtcdClusterStatus struct {
	// Phase: Creating, Running, Scaling, Upgrading, Failed or Deleting.
	// +optional
	Phase EtcdClusterPhase `json:"phase,omitempty"`

	// Conditions: ResourcesReady, Available, Ready, Progressing.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// Members are the cluster's members, by ordinal.
	// +optional
	// +listType=map
	// +listMapKey=name
	Members []EtcdMember `json:"members,omitempty"`

	// HealthyMembers is the number of voting members that answered the
	// operator's last status request.
	// +optional
	HealthyMembers int32 `json:"healthyMembers"`

	// Leader is the name of the member etcd reports as its leader, and
	// LeaderID its ID (hexadecimal).
	// +optional
	Leader string `json:"leader,omitempty"`
	// +optional
	LeaderID string `json:"leaderID,omitempty"`

	// ClusterID is etcd's cluster ID (hexadecimal).
	// +optional
	ClusterID string `json:"clusterID,omitempty"`

	// ReadyReplicas is the number of ready members as the StatefulSet reports it.
	// +optional
	ReadyReplicas int32 `json:"readyReplicas"`

	// CertificatesNotAfter is when the first of the certificates the
	// members and the operator use expires; unset without TLS.
	// +optional
	CertificatesNotAfter *metav1.Time `json:"certificatesNotAfter,omitempty"`

	// ClientEndpoints are the URLs clients connect to (the client Service).
	// +optional
	// +listType=atomic
	ClientEndpoints []string `json:"clientEndpoints,omitempty"`

	// LastUpdateTime is when the phase last changed.
	// +optional
	LastUpdateTime *metav1.Time `json:"lastUpdateTime,omitempty"`

	// ObservedGeneration is the generation of the spec this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// EtcdCluster is an etcd cluster run as a StatefulSet.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=etcd,categories=etcd
// +kubebuilder:printcolumn:name="Size",type=integer,JSONPath=`.spec.size`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyReplicas`
// +kubebuilder:printcolumn:name="Healthy",type=integer,JSONPath=`.status.healthyMembers`
// +kubebuilder:printcolumn:name="Leader",type=string,JSONPath=`.status.leader`,priority=1
// +kubebuilder:printcolumn:name="Version",type=string,JSONPath=`.spec.version`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 52 && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",message="the name must start with a letter and have at most 52 lowercase letters, digits and '-': it names the cluster's Services, StatefulSet and pods"
type EtcdCluster struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   EtcdClusterSpec   `json:"spec,omitempty"`
	Status EtcdClusterStatus `json:"status,omitempty"`
}

// EtcdClusterList is a list of EtcdClusters.
// +kubebuilder:object:root=true
type EtcdClusterList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []EtcdCluster `json:"items"`
}
