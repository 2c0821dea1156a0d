package v1alpha1

import (
	"github.com/cespare/xxhash/v2"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Labels and values on the wire (docs/design.md §1).
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
	// AnnotationMaxStop on a held instance Lease is the instance's promise
	// about stopping, a Go duration ("5s"): every reconcile it cancels
	// because it may no longer act (its Lease lost, its renew deadline
	// passed, its object moved away, its watch behind, its shutdown past
	// its timeout) has returned within this much of the cancellation, or
	// the process has exited. The sharder counts it in every wait that
	// ends with another instance on the objects: an expired Lease is taken
	// no sooner than d + max-stop after its last renewal (and never before
	// 2d), a fenced instance's slots are granted d + max-stop after the
	// fence, and an object released by a forced move is assigned max-stop
	// later as well. Absent: no promise beyond the Lease's own margin
	// (sharder agent, instances from before the promise).
	AnnotationMaxStop = "sharder.dev/max-stop"

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

	// SlotLabelPrefix + ring name is the label holding an object's slot in a
	// ring of unit Slots: a decimal number below the ring's slot count, set
	// once and never changed (docs/design.md §11).
	SlotLabelPrefix = "slot.sharder.dev/"
	// AnnotationSlotsAcknowledged on a held instance Lease of a ring of unit
	// Slots is the instance's acknowledgement, "<ring UID>/<revision>": it
	// holds none of the slots that the ring's slot table of that revision or
	// an earlier one asked it to release, and reconciles none of their
	// objects.
	AnnotationSlotsAcknowledged = "sharder.dev/slots-acknowledged"
	// AnnotationFenced on an instance Lease the sharder took says that it
	// took the Lease to fence a ready instance that did not acknowledge a
	// release within the ring's drainTimeout: the instance's slots are
	// granted to others one lease duration of the instance after the
	// takeover. The value is "true". The fence is over once the instance
	// holds its Lease again; it removes the annotation when it acquires it.
	AnnotationFenced = "sharder.dev/fenced"
)

// ShardLabel returns the label key carrying the instance an object of ring is
// assigned to.
func ShardLabel(ring string) string { return ShardLabelPrefix + ring }

// ObjectKey returns the hash key of a main object of a ring:
// "<group>/<Kind>/<namespace>/<name>", with an empty group for the core API
// group and an empty namespace for cluster-scoped objects. It is part of
// the wire contract: the rings' algorithms place objects by it, a ring of
// unit Slots keyed by Object derives an object's slot from its xxHash, and
// the slot label policy computes the same key in CEL.
func ObjectKey(group, kind, namespace, name string) string {
	return group + "/" + kind + "/" + namespace + "/" + name
}

// ObjectKeyHash returns the 64-bit xxHash of ObjectKey(group, kind,
// namespace, name), the hash the rings' algorithms and a ring of unit Slots
// keyed by Object place a main object by. It hashes the parts one after the
// other instead of building the key, and so allocates nothing.
func ObjectKeyHash(group, kind, namespace, name string) uint64 {
	var d xxhash.Digest
	d.Reset()
	_, _ = d.WriteString(group)
	_, _ = d.WriteString("/")
	_, _ = d.WriteString(kind)
	_, _ = d.WriteString("/")
	_, _ = d.WriteString(namespace)
	_, _ = d.WriteString("/")
	_, _ = d.WriteString(name)
	return d.Sum64()
}

// DrainLabel returns the label key asking an instance of ring to drain an object.
func DrainLabel(ring string) string { return DrainLabelPrefix + ring }

// SlotLabel returns the label key carrying the slot of an object of ring.
func SlotLabel(ring string) string { return SlotLabelPrefix + ring }

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
	DefaultSlotCount    = 256
	// MaxSlotCount bounds spec.assignment.slots.count: a table of that many
	// slots over 1,000 instances takes about 125 KB of the ring's status at
	// worst (every instance's slots scattered).
	MaxSlotCount = 16384
)

// ControllerRingSpec declares which resources are sharded over which instances.
// +kubebuilder:validation:XValidation:rule="(has(self.assignment) && has(self.assignment.unit) ? self.assignment.unit : 'Objects') == (has(oldSelf.assignment) && has(oldSelf.assignment.unit) ? oldSelf.assignment.unit : 'Objects')",message="spec.assignment.unit cannot change: create a new ring instead"
// +kubebuilder:validation:XValidation:rule="(has(self.assignment) && has(self.assignment.slots) && has(self.assignment.slots.count) ? self.assignment.slots.count : 256) == (has(oldSelf.assignment) && has(oldSelf.assignment.slots) && has(oldSelf.assignment.slots.count) ? oldSelf.assignment.slots.count : 256)",message="spec.assignment.slots.count cannot change: an object's slot depends on it"
// +kubebuilder:validation:XValidation:rule="(has(self.assignment) && has(self.assignment.slots) && has(self.assignment.slots.key) ? self.assignment.slots.key : 'Object') == (has(oldSelf.assignment) && has(oldSelf.assignment.slots) && has(oldSelf.assignment.slots.key) ? oldSelf.assignment.slots.key : 'Object')",message="spec.assignment.slots.key cannot change: an object's slot depends on it"
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

	// Assignment chooses when new objects of the ring get their label, and
	// whether the sharder assigns objects or slots to instances.
	// Default: mode Watch, unit Objects.
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

// Assignment units of a ring (spec.assignment.unit).
const (
	// AssignmentUnitObjects: the sharder assigns each object to an instance
	// and writes the instance into the object's shard label; moves write
	// the object (docs/design.md §5).
	AssignmentUnitObjects = "Objects"
	// AssignmentUnitSlots: every object carries a slot label written once;
	// the sharder assigns slots to instances in the ring's status and moves
	// slots without writing any object (docs/design.md §11).
	AssignmentUnitSlots = "Slots"
)

// Keys of an object's slot (spec.assignment.slots.key).
const (
	// SlotKeyObject: the slot of a main object is computed from its hash
	// key <group>/<Kind>/<namespace>/<name>, as object mode maps it.
	SlotKeyObject = "Object"
	// SlotKeyNamespace: the slot of a main object is computed from its
	// namespace, with the hash of the API server's sharded list and watch,
	// so that an instance may select its slots with a shard selector.
	SlotKeyNamespace = "Namespace"
)

// RingAssignment configures how the ring's new objects are assigned.
// +kubebuilder:validation:XValidation:rule="!has(self.slots) || (has(self.unit) && self.unit == 'Slots')",message="spec.assignment.slots applies to unit Slots only"
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

	// Unit is what the sharder assigns to instances: Objects (each object's
	// shard label names its instance, and a move writes the object) or
	// Slots (each object's slot label, written once, names one of the ring's
	// slots; the sharder assigns slots to instances in the ring's status and
	// moves them without writing any object). Fixed when the ring is
	// created. Rings of instances run by sharder agent need Objects.
	// Default: Objects.
	// +optional
	// +kubebuilder:default=Objects
	// +kubebuilder:validation:Enum=Objects;Slots
	Unit string `json:"unit,omitempty"`

	// Slots configures the slots of a ring of unit Slots. Fixed when the
	// ring is created.
	// Default: count 256, key Object.
	// +optional
	Slots *RingSlots `json:"slots,omitempty"`
}

// RingSlots configures the slots of a ring of unit Slots. Neither field can
// change after the ring is created: an object's slot depends on both.
type RingSlots struct {
	// Count is the number of slots. Each ready instance holds its weighted
	// share of them to within one slot, so choose well above the number of
	// instances (at least 16 times the most expected).
	// Default: 256.
	// +optional
	// +kubebuilder:default=256
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=16384
	Count int32 `json:"count,omitempty"`

	// Key is what a main object's slot is computed from: Object (its hash
	// key, as object mode maps it) or Namespace (its namespace, with the
	// hash of the API server's sharded list and watch, so that all objects
	// of a namespace share a slot and instances may select their slots with
	// a shard selector). Controlled objects take their controller's slot
	// either way.
	// Default: Object.
	// +optional
	// +kubebuilder:default=Object
	// +kubebuilder:validation:Enum=Object;Namespace
	Key string `json:"key,omitempty"`
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
	// Slots is the slot table of a ring of unit Slots: which instance holds
	// which slot. Written by the leading sharder only, each write locked on
	// the ring's resourceVersion (docs/design.md §11).
	// +optional
	Slots *SlotTable `json:"slots,omitempty"`
}

// SlotTable is the assignment of a ring's slots to its instances. A slot in
// no instance's lists is unassigned.
type SlotTable struct {
	// Revision grows by one with every change of the table. Instances
	// ignore a table older than one they acted on, and acknowledge releases
	// by revision.
	Revision int64 `json:"revision"`
	// Instances are the instances holding slots, sorted by name.
	// +optional
	// +listType=map
	// +listMapKey=name
	Instances []SlotHolder `json:"instances,omitempty"`
}

// SlotHolder is one instance's slots in a slot table. Slot lists are
// comma-separated slot numbers and ranges, ascending ("0-63,128").
type SlotHolder struct {
	// Name is the instance ID (= Lease name).
	Name string `json:"name"`
	// Granted are the slots the instance watches and reconciles.
	// +optional
	Granted string `json:"granted,omitempty"`
	// Releasing are the slots the instance is asked to let go of, grouped
	// by the revision of the table that asked; it may still reconcile their
	// objects until it acknowledges that revision.
	// +optional
	// +listType=atomic
	Releasing []SlotRelease `json:"releasing,omitempty"`
}

// SlotRelease is a set of slots asked to be released by one table revision.
type SlotRelease struct {
	// Revision is the revision of the table that asked for the release.
	Revision int64 `json:"revision"`
	// Slots are the slots asked for.
	Slots string `json:"slots"`
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
	// Slots is the number of slots granted to the instance (unit Slots).
	// +optional
	Slots int32 `json:"slots,omitempty"`
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
