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

	// ClusterName is the EtcdCluster restored into.
	// +required
	// +kubebuilder:validation:MinLength=1
	ClusterName string `json:"clusterName"`

	// ClusterTemplate is the spec of the cluster created by a New restore.
	// +optional
	ClusterTemplate *EtcdClusterSpec `json:"clusterTemplate,omitempty"`

	// RestoreType: New or Replace.
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
	// +optional
	Phase EtcdRestorePhase `json:"phase,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
	// +optional
	RestoredCluster string `json:"restoredCluster,omitempty"`
	// +optional
	RestoredSize int64 `json:"restoredSize,omitempty"`
}

// EtcdRestore restores an EtcdBackup into a cluster. The operator does not
// act on restores yet: the type is declared so tools can refer to it.
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
