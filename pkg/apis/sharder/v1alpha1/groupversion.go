package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of the sharder's API.
	GroupVersion = schema.GroupVersion{Group: "sharder.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the types of this group and version.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the types of this group and version to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &ControllerRing{}, &ControllerRingList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
