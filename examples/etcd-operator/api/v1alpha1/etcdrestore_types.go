package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// EtcdRestoreType says what a restore does with its target cluster.
// +kubebuilder:validation:Enum=New;Replace
type EtcdRestoreType string

// Restore types.
const (
	// RestoreTypeNew creates a new cluster from clusterTemplate.
	RestoreTypeNew EtcdRestoreType = "New"
	// RestoreTypeReplace replaces the data of an existing cluster.
	RestoreTypeReplace EtcdRestoreType = "Replace"
)

// EtcdRestorePhase is where a restore is in its life cycle.
// +kubebuilder:validation:Enum=Pending;Running;Completed;Failed
type EtcdRestorePhase string

// Phases of a restore.
const (
	EtcdRestorePhasePending   EtcdRestorePhase = "Pending"
	EtcdRestorePhaseRunning   EtcdRestorePhase = "Running"
	EtcdRestorePhaseCompleted EtcdRestorePhase = "Completed"
	EtcdRestorePhaseFailed    EtcdRestorePhase = "Failed"
)

// EtcdRestoreSpec asks to restore an EtcdBackup into a cluster.
type EtcdRestoreSpec struct {
	// BackupName is the EtcdBackup to restore.
	// +required
	// +kubebuilder:validation:MinLength=1
	BackupName string `json:"backupName"`

	// BackupNamespace is the EtcdBackup's namespace.
	// Default: the restore's namespace.
	// +optional
	BackupNamespace string `json:"backupNamespace,omitempty"`

	// ClusterName is the EtcdCluster restored into, in the restore's
	// namespace. A New restore creates it and refuses to touch a cluster
	// of that name that it did not create.
	// +required
	// +kubebuilder:validation:MinLength=1
	ClusterName string `json:"clusterName"`

	// ClusterTemplate is the spec of the cluster created by a New restore.
	// Default: an empty spec (the cluster's defaults).
	// +optional
	ClusterTemplate *EtcdClusterSpec `json:"clusterTemplate,omitempty"`

	// RestoreType: New or Replace. Only New is supported: a Replace
	// restore fails with the reason RestoreTypeNotSupported.
	// Default: New.
	// +optional
	// +kubebuilder:default=New
	RestoreType EtcdRestoreType `json:"restoreType,omitempty"`

	// SkipHashCheck skips the snapshot's integrity check.
	// +optional
	SkipHashCheck bool `json:"skipHashCheck,omitempty"`
}

// EtcdRestoreStatus is the observed state of a restore.
type EtcdRestoreStatus struct {
	// Phase: Pending until the backup's snapshot is found, Running while
	// the restored cluster starts, Completed once it is Running.
	// +optional
	Phase EtcdRestorePhase `json:"phase,omitempty"`
	// Conditions: Succeeded.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// StartTime is when the restored cluster was created.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// CompletionTime is when the restored cluster was first Running.
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
	// RestoredCluster is the EtcdCluster the restore created.
	// +optional
	RestoredCluster string `json:"restoredCluster,omitempty"`
	// RestoredSize is the size in bytes of the snapshot restored, as stored.
	// +optional
	RestoredSize int64 `json:"restoredSize,omitempty"`
}

// EtcdRestore creates a new EtcdCluster whose members start from the last
// snapshot of an EtcdBackup: each member's data directory is restored from
// the snapshot by an init container before etcd starts.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:categories=etcd
// +kubebuilder:printcolumn:name="Backup",type=string,JSONPath=`.spec.backupName`
// +kubebuilder:printcolumn:name="Cluster",type=string,JSONPath=`.spec.clusterName`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type EtcdRestore struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   EtcdRestoreSpec   `json:"spec,omitempty"`
	Status EtcdRestoreStatus `json:"status,omitempty"`
}

// EtcdRestoreList is a list of EtcdRestores.
// +kubebuilder:object:root=true
type EtcdRestoreList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []EtcdRestore `json:"items"`
}
