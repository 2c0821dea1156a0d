package instance

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// Selector returns the label selector shard.sharder.dev/<ring>=<identity>:
// it matches exactly the objects of ring assigned to the instance identity,
// including those the sharder asks it to drain (they keep the shard label
// until the instance acknowledges).
func Selector(ring, identity string) labels.Selector {
	return labels.SelectorFromSet(labels.Set{v1alpha1.ShardLabel(ring): identity})
}

// TweakListOptions returns a function that adds the instance's selector to
// list and watch requests, ANDed with any label selector already set. It is
// meant for client-go informers of the ring's resources, e.g. with
// cache.NewFilteredListWatchFromClient or a dynamic informer factory.
func TweakListOptions(ring, identity string) func(*metav1.ListOptions) {
	selector := Selector(ring, identity).String()
	return func(opts *metav1.ListOptions) {
		if opts.LabelSelector == "" {
			opts.LabelSelector = selector
			return
		}
		opts.LabelSelector += "," + selector
	}
}

// WithTweakListOptions restricts a client-go SharedInformerFactory to the
// objects assigned to identity in ring:
//
//	factory := informers.NewSharedInformerFactoryWithOptions(clientset, resync,
//		instance.WithTweakListOptions(ring, identity))
//
// The option applies to every informer of the factory: use a factory of its
// own for the ring's resources and another one for everything else.
func WithTweakListOptions(ring, identity string) informers.SharedInformerOption {
	return informers.WithTweakListOptions(TweakListOptions(ring, identity))
}
