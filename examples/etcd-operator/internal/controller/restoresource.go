package controller

import (
	"encoding/json"
	"strconv"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	etcdv1alpha1 "github.com/sharder-dev/sharder/examples/etcd-operator/api/v1alpha1"
)

// AnnotationRestoreSource on an EtcdCluster made by an EtcdRestore says
// which snapshot its members start from (a restoreSource in JSON). The
// restore writes it when it creates the cluster; the cluster's members get
// an init container that restores the snapshot into an empty data
// directory.
const AnnotationRestoreSource = "etcd.example.sharder.dev/restore-source"

// restoreContainerName is the init container restoring a member's data.
const restoreContainerName = "restore"

// RestoreMemberCommand is the operator's subcommand the init container runs.
const RestoreMemberCommand = "restore-member"

// Environment of the restore init container, besides the etcd container's
// own (member name, initial cluster, data directory).
const (
	EnvRestoreEndpoint      = "RESTORE_S3_ENDPOINT"
	EnvRestoreBucket        = "RESTORE_S3_BUCKET"
	EnvRestoreKey           = "RESTORE_S3_KEY"
	EnvRestoreRegion        = "RESTORE_S3_REGION"
	EnvRestoreSkipHashCheck = "RESTORE_SKIP_HASH_CHECK"
)

// restoreSource is the content of AnnotationRestoreSource.
type restoreSource struct {
	// Restore and RestoreUID name the EtcdRestore that made the cluster.
	Restore    string    `json:"restore"`
	RestoreUID types.UID `json:"restoreUID"`
	// Image runs RestoreMemberCommand: the operator's image.
	Image string `json:"image"`
	// Where the snapshot is, and the Secret (in the cluster's namespace)
	// with the keys to read it.
	Endpoint          string `json:"endpoint,omitempty"`
	Region            string `json:"region,omitempty"`
	Bucket            string `json:"bucket"`
	Key               string `json:"key"`
	CredentialsSecret string `json:"credentialsSecret"`
	SkipHashCheck     bool   `json:"skipHashCheck,omitempty"`
}

// restoreSourceOf reads c's AnnotationRestoreSource; false if it has none
// or it does not parse.
func restoreSourceOf(c *etcdv1alpha1.EtcdCluster) (restoreSource, bool) {
	raw, ok := c.Annotations[AnnotationRestoreSource]
	if !ok {
		return restoreSource{}, false
	}
	var src restoreSource
	if err := json.Unmarshal([]byte(raw), &src); err != nil || src.Image == "" || src.Key == "" {
		return restoreSource{}, false
	}
	return src, true
}

// withRestore adds to the members of a restored cluster (one with
// AnnotationRestoreSource) the init container that restores the snapshot
// into the member's data directory, as that member, when the directory is
// empty. It sees what etcd will see: the etcd container's environment and
// data volume. Other StatefulSets are returned unchanged.
func withRestore(c *etcdv1alpha1.EtcdCluster, sts *appsv1.StatefulSet) *appsv1.StatefulSet {
	src, ok := restoreSourceOf(c)
	if !ok || len(sts.Spec.Template.Spec.Containers) == 0 {
		return sts
	}
	etcd := sts.Spec.Template.Spec.Containers[0]
	secretKey := func(key string) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: src.CredentialsSecret}, Key: key,
		}}
	}
	env := append([]corev1.EnvVar{}, etcd.Env...)
	env = append(env,
		corev1.EnvVar{Name: EnvRestoreEndpoint, Value: src.Endpoint},
		corev1.EnvVar{Name: EnvRestoreRegion, Value: src.Region},
		corev1.EnvVar{Name: EnvRestoreBucket, Value: src.Bucket},
		corev1.EnvVar{Name: EnvRestoreKey, Value: src.Key},
		corev1.EnvVar{Name: EnvRestoreSkipHashCheck, Value: strconv.FormatBool(src.SkipHashCheck)},
		corev1.EnvVar{Name: SecretKeyAccessKeyID, ValueFrom: secretKey(SecretKeyAccessKeyID)},
		corev1.EnvVar{Name: SecretKeySecretAccessKey, ValueFrom: secretKey(SecretKeySecretAccessKey)},
	)
	sts.Spec.Template.Spec.InitContainers = append(sts.Spec.Template.Spec.InitContainers, corev1.Container{
		Name:         restoreContainerName,
		Image:        src.Image,
		Args:         []string{RestoreMemberCommand},
		EnvFrom:      etcd.EnvFrom,
		Env:          env,
		VolumeMounts: etcd.VolumeMounts,
		Resources:    etcd.Resources,
		// The data directory is root's, as etcd runs as root.
		SecurityContext: &corev1.SecurityContext{RunAsUser: ptr.To[int64](0)},
	})
	return sts
}
