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

// Condition type of an EtcdBackup and an EtcdRestore.
const (
	// ConditionSucceeded says how the last attempt went: Unknown while it
	// runs, True once it completed, False with the reason it failed.
	ConditionSucceeded = "Succeeded"
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

	// StorageType is where the snapshot goes. Only S3 (any S3-compatible
	// store) is supported: a backup to GCS or Local fails with the reason
	// StorageNotSupported.
	// +required
	StorageType EtcdBackupStorageType `json:"storageType"`

	// Schedule is a cron expression for recurring backups: five fields
	// (minute to day of week), or six with seconds first, or a descriptor
	// such as @hourly or @every 10m. Times are UTC. Each run is due at the
	// schedule's next time after the last completed backup.
	// Default: a single backup.
	// +optional
	Schedule string `json:"schedule,omitempty"`

	// +optional
	S3 *EtcdS3BackupSpec `json:"s3,omitempty"`
	// +optional
	GCS *EtcdGCSBackupSpec `json:"gcs,omitempty"`
	// +optional
	Local *EtcdLocalBackupSpec `json:"local,omitempty"`

	// RetentionPolicy bounds how many snapshots of this EtcdBackup are kept
	// in the store: after each completed backup the oldest beyond
	// maxBackups are deleted.
	// +optional
	RetentionPolicy EtcdRetentionPolicy `json:"retentionPolicy,omitempty"`

	// Compression stores the snapshot gzip-compressed (key ending .db.gz).
	// +optional
	Compression bool `json:"compression,omitempty"`
}

// EtcdS3BackupSpec is a bucket of an S3-compatible store. Snapshots are
// written as <prefix>/<namespace>/<backup name>/<start time>.db.
type EtcdS3BackupSpec struct {
	// Bucket must exist.
	// +required
	// +kubebuilder:validation:MinLength=1
	Bucket string `json:"bucket"`
	// +optional
	Prefix string `json:"prefix,omitempty"`
	// +optional
	Region string `json:"region,omitempty"`
	// Endpoint is the store's URL, http:// or https://.
	// Default: AWS S3.
	// +optional
	Endpoint string `json:"endpoint,omitempty"`
	// CredentialsSecret names a Secret in the backup's namespace with the
	// keys AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY. A restore needs a
	// Secret of the same name in its own namespace.
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

// EtcdBackupStatus is the observed state of a backup: its last attempt,
// and the last snapshot that completed. A scheduled backup is Completed
// between runs.
type EtcdBackupStatus struct {
	// Phase of the last attempt. Running while a snapshot is taken; an
	// attempt cut short (its operator instance stopped) is started again.
	// +optional
	Phase EtcdBackupPhase `json:"phase,omitempty"`
	// Conditions: Succeeded.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// ObservedGeneration is the generation of the spec the last attempt used.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// BackupSize is the size in bytes of the last completed snapshot as
	// stored (after compression).
	// +optional
	BackupSize int64 `json:"backupSize,omitempty"`
	// StartTime is when the last attempt started.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// CompletionTime is when the last completed snapshot was stored.
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
	// StoragePath is where the last completed snapshot is: s3://bucket/key.
	// +optional
	StoragePath string `json:"storagePath,omitempty"`
	// EtcdVersion is the version of the etcd member the last completed
	// snapshot was taken from.
	// +optional
	EtcdVersion string `json:"etcdVersion,omitempty"`
	// EtcdRevision is that member's revision when the last completed
	// snapshot started: the snapshot holds this revision (and any write
	// that came in between).
	// +optional
	EtcdRevision int64 `json:"etcdRevision,omitempty"`
}

// EtcdBackup takes snapshots of an EtcdCluster through the etcd client and
// stores them in an S3-compatible store: once, or on a schedule keeping the
// newest retentionPolicy.maxBackups. Deleting it leaves the stored snapshots.
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
