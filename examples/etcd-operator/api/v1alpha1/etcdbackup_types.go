package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// EtcdBackupStorageType names where a backup is written.
// +kubebuilder:validation:Enum=S3;GCS;Local
type EtcdBackupStorageType string

// Storage types of a backup.
const (
	BackupStorageS3    EtcdBackupStorageType = "S3"
	BackupStorageGCS   EtcdBackupStorageType = "GCS"
	BackupStorageLocal EtcdBackupStorageType = "Local"
)

// EtcdBackupPhase is where a backup is in its life cycle.
// +kubebuilder:validation:Enum=Pending;Running;Completed;Failed
type EtcdBackupPhase string

// Phases of a backup.
const (
	EtcdBackupPhasePending   EtcdBackupPhase = "Pending"
	EtcdBackupPhaseRunning   EtcdBackupPhase = "Running"
	EtcdBackupPhaseCompleted EtcdBackupPhase = "Completed"
	EtcdBackupPhaseFailed    EtcdBackupPhase = "Failed"
)

// EtcdBackupSpec asks for a snapshot of an EtcdCluster.
// +kubebuilder:validation:XValidation:rule="self.storageType != 'S3' || has(self.s3)",message="storageType S3 needs s3"
// +kubebuilder:validation:XValidation:rule="self.storageType != 'GCS' || has(self.gcs)",message="storageType GCS needs gcs"
// +kubebuilder:validation:XValidation:rule="self.storageType != 'Local' || has(self.local)",message="storageType Local needs local"
type EtcdBackupSpec struct {
	// ClusterName is the EtcdCluster to back up.
	// +required
	// +kubebuilder:validation:MinLength=1
	ClusterName string `json:"clusterName"`

	// ClusterNamespace is the EtcdCluster's namespace.
	// Default: the backup's namespace.
	// +optional
	ClusterNamespace string `json:"clusterNamespace,omitempty"`

	// StorageType is where the snapshot goes.
	// +required
	StorageType EtcdBackupStorageType `json:"storageType"`

	// Schedule is a cron expression for recurring backups.
	// Default: a single backup.
	// +optional
	Schedule string `json:"schedule,omitempty"`

	// +optional
	S3 *EtcdS3BackupSpec `json:"s3,omitempty"`
	// +optional
	GCS *EtcdGCSBackupSpec `json:"gcs,omitempty"`
	// +optional
	Local *EtcdLocalBackupSpec `json:"local,omitempty"`

	// RetentionPolicy bounds how many backups are kept.
	// +optional
	RetentionPolicy EtcdRetentionPolicy `json:"retentionPolicy,omitempty"`

	// Compression compresses the snapshot.
	// +optional
	Compression bool `json:"compression,omitempty"`
}

// EtcdS3BackupSpec is an S3 bucket.
type EtcdS3BackupSpec struct {
	// +required
	// +kubebuilder:validation:MinLength=1
	Bucket string `json:"bucket"`
	// +optional
	Prefix string `json:"prefix,omitempty"`
	// +optional
	Region string `json:"region,omitempty"`
	// +optional
	Endpoint string `json:"endpoint,omitempty"`
	// CredentialsSecret names a Secret with the access keys.
	// +optional
	CredentialsSecret string `json:"credentialsSecret,omitempty"`
}

// EtcdGCSBackupSpec is a Google Cloud Storage bucket.
type EtcdGCSBackupSpec struct {
	// +required
	// +kubebuilder:validation:MinLength=1
	Bucket string `json:"bucket"`
	// +optional
	Prefix string `json:"prefix,omitempty"`
	// CredentialsSecret names a Secret with the service account key.
	// +optional
	CredentialsSecret string `json:"credentialsSecret,omitempty"`
}

// EtcdLocalBackupSpec is a persistent volume claim.
type EtcdLocalBackupSpec struct {
	// +required
	// +kubebuilder:validation:MinLength=1
	PersistentVolumeClaim string `json:"persistentVolumeClaim"`
	// +optional
	Path string `json:"path,omitempty"`
}

// EtcdRetentionPolicy bounds the number of kept backups.
type EtcdRetentionPolicy struct {
	// MaxBackups kept; 0 keeps all.
	// +optional
	// +kubebuilder:validation:Minimum=0
	MaxBackups int32 `json:"maxBackups,omitempty"`
}

// EtcdBackupStatus is the observed state of a backup.
type EtcdBackupStatus struct {
	// +optional
	Phase EtcdBackupPhase `json:"phase,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// +optional
	BackupSize int64 `json:"backupSize,omitempty"`
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
	// +optional
	StoragePath string `json:"storagePath,omitempty"`
	// +optional
	EtcdVersion string `json:"etcdVersion,omitempty"`
	// +optional
	EtcdRevision int64 `json:"etcdRevision,omitempty"`
}

// EtcdBackup is a snapshot of an EtcdCluster. The operator does not act on
// backups yet: the type is declared so clusters and tools can refer to it.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:categories=etcd
// +kubebuilder:printcolumn:name="Cluster",type=string,JSONPath=`.spec.clusterName`
// +kubebuilder:printcolumn:name="Storage",type=string,JSONPath=`.spec.storageType`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type EtcdBackup struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   EtcdBackupSpec   `json:"spec,omitempty"`
	Status EtcdBackupStatus `json:"status,omitempty"`
}

// EtcdBackupList is a list of EtcdBackups.
// +kubebuilder:object:root=true
type EtcdBackupList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []EtcdBackup `json:"items"`
}
