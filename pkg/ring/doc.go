// Package ring decides which instance owns which object.
//
// A Ring is built by an Algorithm from a membership (instance IDs with
// weights) and answers Lookup(key) with an instance ID. Hash keys are built
// from object metadata (main objects) or by following controller
// ownerReferences (controlled objects).
package ring
