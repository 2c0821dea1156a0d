package metacache

import "k8s.io/apimachinery/pkg/types"

// maxDescendants bounds a walk below one object: a chain of controllers
// that long is a loop of bad references, not a tree.
const maxDescendants = 1 << 16

// Descendant is an object found below another by Descendants, with the
// index of the cache that holds it.
type Descendant struct {
	Cache  int
	Object *Object
}

// Descendants returns the objects of caches whose chain of controllers
// leads to root through objects of caches, parents before their children:
// both sides of the sharder (the assignment of labels in object mode and
// the slot labeler in slot mode) move an object's tree with it. A
// namespaced owner controls objects of its own namespace only; a
// cluster-scoped one, of any. An object skip reports true for is left out,
// and so is what it controls.
func Descendants(root *Object, caches []*Cache, skip func(*Object) bool) []Descendant {
	if len(caches) == 0 {
		return nil
	}
	type owner struct {
		uid       types.UID
		namespace string
	}
	var out []Descendant
	visited := map[types.UID]bool{root.UID: true}
	queue := []owner{{root.UID, root.Namespace}}
	for len(queue) > 0 && len(visited) < maxDescendants {
		o := queue[0]
		queue = queue[1:]
		for i, c := range caches {
			for m := range c.ByController(o.uid) {
				if visited[m.UID] || (o.namespace != "" && m.Namespace != o.namespace) || (skip != nil && skip(m)) {
					continue
				}
				visited[m.UID] = true
				out = append(out, Descendant{Cache: i, Object: m})
				queue = append(queue, owner{m.UID, m.Namespace})
			}
		}
	}
	return out
}
