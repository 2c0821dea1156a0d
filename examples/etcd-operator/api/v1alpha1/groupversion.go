package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of the etcd operator's API.
	GroupVersion = schema.GroupVersion{Group: "etcd.example.sharder.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the types of this group and version.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the types of this group and version to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
