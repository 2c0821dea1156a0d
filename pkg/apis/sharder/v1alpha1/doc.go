// Package v1alpha1 holds the ControllerRing API of group sharder.dev.
//
// +kubebuilder:object:generate=true
// +groupName=sharder.dev
package v1alpha1
