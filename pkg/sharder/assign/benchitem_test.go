package assign

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

var benchResource = &resourceCache{res: resource{gk: schema.GroupKind{Group: "apps", Kind: "Deployment"}}}

func benchItem(i int) item {
	return item{res: benchResource, namespace: "team-a", name: fmt.Sprintf("object-%05d", i)}
}
