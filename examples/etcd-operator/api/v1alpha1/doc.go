// Package v1alpha1 holds the API of the example etcd operator, group
// etcd.example.sharder.dev: EtcdCluster (reconciled by the operator),
// EtcdBackup and EtcdRestore (declared, not yet reconciled).
//
// Validation lives in the CRD schema so the API server enforces it at
// admission without a webhook: the size of a cluster is odd and between 1 and
// 9, the version is a 3.x.y release, and updates may neither downgrade the
// version nor shrink a cluster of three or more members below three.
//
// +kubebuilder:object:generate=true
// +groupName=etcd.example.sharder.dev
package v1alpha1
