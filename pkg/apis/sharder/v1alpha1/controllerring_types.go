package v1alpha1

import (
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Labels and values on the wire (DESIGN §1).
const (
	// LabelRing on an instance Lease names the ring the instance belongs to.
	LabelRing = "sharder.dev/ring"
	// LabelVirtualNodes on an instance Lease sets the instance's weight: a
	// positive integer; absent means the ring's default.
	LabelVirtualNodes = "sharder.dev/virtual-nodes"
	// LabelState on an instance Lease is the state the sharder last computed,
	// written for people (kubectl get leases -L sharder.dev/state).
	LabelState = "sharder.dev/state"
	// AnnotationRestarting on an instance Lease without a holder says that
	// the instance handed the Lease back to restart with the same ID: the
	// sharder keeps its objects where they are for the ring's restartHold.
	// The value is not read; the instance writes "true".
	AnnotationRestarting = "sharder.dev/restarting"
	// AnnotationMaxWatchLag on a held instance Lease is the instance's
	// promise about its watches, a Go duration ("10s"): it stops reconciling
	// whenever its own last Lease renewal seen back through its watch was
	// written longer ago than this, so it acts on no view of the API server
	// older than this. The sharder waits this much longer (besides its force
	// grace) after releasing an object the instance did not let go of before
	// assigning it to another instance. Absent: no promise (sharder agent).
	AnnotationMaxWatchLag = "sharder.dev/max-watch-lag"

	// FinalizerLabels on a ControllerRing keeps it until the sharder removed
	// the ring's shard and drain labels from every object of its resources,
	// so that deleting a ring leaves no object drained or labelled for an
	// instance of a ring that is gone. The sharder adds it to every ring.
	FinalizerLabels = "sharder.dev/labels"

	// ShardLabelPrefix + ring name is the label holding an object's instance.
	ShardLabelPrefix = "shard.sharder.dev/"
	// DrainLabelPrefix + ring name is the label asking the instance to let go
	// of an object; its value is "true".
	DrainLabelPrefix = "drain.sharder.dev/"
)

// ShardLabel returns the label key carrying the instance an object of ring is
// assigned to.
func ShardLabel(ring string) string { return ShardLabelPrefix + ring }

// DrainLabel returns the label key asking an instance of ring to drain an object.
func DrainLabel(ring string) string { return DrainLabelPrefix + ring }

// Built-in algorithms a ring can use; a sharder built with more registered
// (ring.Register) accepts their names too.
const (
	AlgorithmConsistentHash      = "consistent-hash"
	AlgorithmConsistentHashDense = "consistent-hash-dense"
	AlgorithmRendezvous          = "rendezvous"
	AlgorithmHashMod             = "hash-mod"
	AlgorithmRange               = "range"
)

// Defaults of ControllerRingSpec fields.
const (
	DefaultAlgorithm    = AlgorithmConsistentHash
	DefaultVirtualNodes = 512
	DefaultDrainTimeout = 30 // seconds
	DefaultRestartHold  = 30 // seconds
)

// ControllerRingSpec declares which resources are sharded over which instances.
// +kubebuilder:validation:XValidation:rule="self.resources.all(r, self.resources.exists_one(o, o.resource == r.resource && (((has(o.group) ? o.group.size() : 0) == 0 && (has(r.group) ? r.group.size() : 0) == 0) || (has(o.group) && has(r.group) && o.group == r.group))))",message="a resource is listed more than once in spec.resources"
type ControllerRingSpec struct {
	// LeaseNamespace is the namespace holding the instances' Leases, each
	// labelled sharder.dev/ring=<ring name>.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	LeaseNamespace string `json:"leaseNamespace"`

	// Resources are the ring's main resources, each with the resources its
	// controller owns. Every object of a main resource is assigned to one
	// instance; controlled objects follow their controller.
	// +required
	// +listType=atomic
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=32
	Resources []RingResource `json:"resources"`

	// NamespaceSelector selects the namespaces whose objects are sharded.
	// Default (unset): every namespace except kube-system.
	// +optional
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`

	// Algorithm maps objects to instances: one of the built-in algorithms
	// (consistent-hash, consistent-hash-dense, rendezvous, hash-mod, range)
	// or the name of an algorithm the running sharder was built with
	// (registered with ring.Register): lowercase letters, digits, '-' and
	// '.', at most 63 characters. consistent-hash-dense balances and builds
	// well up to thousands of instances; switching a ring to it (or to any
	// other algorithm) moves most of its objects once. A name the sharder
	// does not know leaves the ring not ready (reason UnknownAlgorithm) and
	// nothing of it is assigned or moved.
	// Default: consistent-hash.
	// +optional
	// +kubebuilder:default=consistent-hash
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	Algorithm string `json:"algorithm,omitempty"`

	// VirtualNodes is the weight of an instance whose Lease carries no
	// sharder.dev/virtual-nodes label. At most 10000, the bound of that
	// label too.
	// Default: 512.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	VirtualNodes *int32 `json:"virtualNodes,omitempty"`

	// DrainTimeout is how long the sharder waits for an instance to
	// acknowledge a drain before it moves the object anyway.
	// Default: 30s.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s')",message="drainTimeout must be positive"
	DrainTimeout *metav1.Duration `json:"drainTimeout,omitempty"`

	// RestartHold is how long the sharder keeps the objects of an instance
	// that handed its Lease back to restart with the same ID (a
	// StatefulSet's pod on a rolling update) where they are: they wait for
	// the instance to come back instead of moving away and back again. The
	// next process with the same ID acquires the Lease at once and resumes;
	// if none has by then, the objects move as from any instance that
	// stopped. 0 turns it off: such an instance's objects move at once.
	// Default: 30s.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s')",message="restartHold must not be negative"
	RestartHold *metav1.Duration `json:"restartHold,omitempty"`

	// InstanceServiceAccounts are the identities of the ring's instances: the
	// webhook lets only them (and the sharder) acknowledge a drain: remove the
	// drain label and hand the object over to the instance it names, or
	// remove both labels.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	InstanceServiceAccounts []ServiceAccountReference `json:"instanceServiceAccounts,omitempty"`

	// Webhook configures how the label-protecting webhook treats this ring.
	// +optional
	Webhook *RingWebhook `json:"webhook,omitempty"`

	// Assignment chooses when new objects of the ring get their shard label.
	// Default: mode Watch.
	// +optional
	Assignment *RingAssignment `json:"assignment,omitempty"`
}

// Assignment modes of a ring (spec.assignment.mode).
const (
	// AssignmentWatch: the sharder labels a new object when its watch sees
	// it, with one write per object.
	AssignmentWatch = "Watch"
	// AssignmentAdmission: a mutating webhook, served by every sharder
	// replica, labels a new object in its create request; the sharder
	// labels by watch only what the webhook left unlabelled.
	AssignmentAdmission = "Admission"
)

// RingAssignment configures how the ring's new objects are assigned.
type RingAssignment struct {
	// Mode is Watch (the sharder labels new objects from its watch, after
	// they are created) or Admission (a mutating webhook labels new objects
	// of the ring's resources in their create request, so that they are
	// never seen unassigned; objects it cannot place are labelled by watch).
	// Default: Watch.
	// +optional
	// +kubebuilder:default=Watch
	// +kubebuilder:validation:Enum=Watch;Admission
	Mode string `json:"mode,omitempty"`
}

// RingResource is a main resource of a ring and the resources it controls.
type RingResource struct {
	// Group is the API group; empty for the core group.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Group string `json:"group"`
	// Resource is the plural resource name, e.g. "configmaps".
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	Resource string `json:"resource"`

	// ControlledResources are resources whose objects carry a controller
	// ownerReference to an object of this resource (or of another controlled
	// resource of it). They are assigned with their controller. A resource
	// listed here and as a main resource counts as main; duplicates are
	// ignored.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	ControlledResources []metav1.GroupResource `json:"controlledResources,omitempty"`
}

// ServiceAccountReference names a ServiceAccount.
type ServiceAccountReference struct {
	// +required
	// +kubebuilder:validation:MinLength=1
	Namespace string `json:"namespace"`
	// +required
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
}

// RingWebhook configures the validating webhook for one ring.
type RingWebhook struct {
	// FailurePolicy applies when the webhook cannot answer: Ignore lets
	// writes through unprotected (availability first), Fail rejects them.
	// Default: Ignore.
	// +optional
	// +kubebuilder:validation:Enum=Ignore;Fail
	FailurePolicy *admissionregistrationv1.FailurePolicyType `json:"failurePolicy,omitempty"`
}

// Condition types and reasons of a ControllerRing.
const (
	// ConditionReady is True when every resource of the ring is watched and
	// at least one instance is ready.
	ConditionReady = "Ready"

	ReasonReady             = "Ready"
	ReasonNoReadyInstances  = "NoReadyInstances"
	ReasonResourceNotServed = "ResourceNotServed"
	ReasonResourceForbidden = "ResourceForbidden"
	ReasonInvalidSpec       = "InvalidSpec"
	ReasonCachesNotSynced   = "CachesNotSynced"
	// ReasonUnknownAlgorithm: spec.algorithm names no algorithm the running
	// sharder knows; nothing of the ring is assigned or moved.
	ReasonUnknownAlgorithm = "UnknownAlgorithm"
)

// ControllerRingStatus is the ring as the sharder last observed it.
type ControllerRingStatus struct {
	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: Ready.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Instances is the number of instance Leases of the ring.
	// +optional
	Instances int32 `json:"instances"`
	// AvailableInstances is the number of ready instances.
	// +optional
	AvailableInstances int32 `json:"availableInstances"`
	// Objects is the number of main objects of the ring.
	// +optional
	Objects int32 `json:"objects"`
	// UnassignedObjects is the number of objects carrying no shard label.
	// +optional
	UnassignedObjects int32 `json:"unassignedObjects,omitempty"`
	// Drains is the number of drains in flight.
	// +optional
	Drains int32 `json:"drains,omitempty"`
	// Members are the ring's instances, sorted by name.
	// +optional
	// +listType=map
	// +listMapKey=name
	Members []MemberStatus `json:"members,omitempty"`
}

// MemberStatus is one instance of a ring.
type MemberStatus struct {
	// Name is the instance ID (= Lease name).
	Name string `json:"name"`
	// State is ready, restarting, expired, uncertain, vanished, dead, orphaned or invalid
	// (docs/design.md §3).
	State string `json:"state"`
	// VirtualNodes is the instance's weight.
	// +optional
	VirtualNodes int32 `json:"virtualNodes,omitempty"`
	// Objects is the number of main objects assigned to the instance.
	// +optional
	Objects int32 `json:"objects"`
}

// ControllerRing declares a ring: resources whose objects are spread over the
// instances of one controller.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=ring;rings,categories=sharder
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Available",type=integer,JSONPath=`.status.availableInstances`
// +kubebuilder:printcolumn:name="Instances",type=integer,JSONPath=`.status.instances`
// +kubebuilder:printcolumn:name="Objects",type=integer,JSONPath=`.status.objects`
// +kubebuilder:printcolumn:name="Algorithm",type=string,JSONPath=`.spec.algorithm`,priority=1
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 63 && self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",message="the ring name must be a DNS label (at most 63 lowercase letters, digits and '-'): it is used in label keys"
type ControllerRing struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ControllerRingSpec   `json:"spec,omitempty"`
	Status ControllerRingStatus `json:"status,omitempty"`
}

// ControllerRingList is a list of ControllerRings.
// +kubebuilder:object:root=true
type ControllerRingList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ControllerRing `json:"items"`
}
