// Package owners finds the main object at the top of an object's chain of
// controller ownerReferences, and so the hash key that places a controlled
// object on the same instance as its main object (docs/design.md §4). It
// reads object metadata only, through the functions a Resolver is given.
package owners
