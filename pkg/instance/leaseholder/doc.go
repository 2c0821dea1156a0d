// Package leaseholder holds an instance's Lease: the membership record through
// which the sharder knows that the instance is alive. It is the part of the
// instance library that does not need controller-runtime's reconcilers:
// package instance runs it for controller-runtime managers, `sharder agent`
// runs it as a sidecar, and plain client-go controllers can run it
// themselves.
//
// NewHolder returns a Holder, a manager.Runnable (its Start blocks until the
// context ends) that creates or acquires the Lease named after the instance
// ID in the ring's lease namespace, renews it, tells the caller through
// OnLost when it can no longer vouch for it, and releases it on shutdown.
// Options states every default and timing rule; the instance ID
// defaults to membership.DefaultIdentity (POD_NAME, else the hostname), and
// ValidateIdentity checks an ID before it is used (NewHolder checks it too).
//
// The package depends on neither the sharder's controllers nor its metrics:
// embedding it in a controller registers nothing in the process.
package leaseholder
