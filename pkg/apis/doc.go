// Package apis holds the sharder's API types. The ControllerRing, in
// sharder/v1alpha1, declares a ring: the resources sharded together, where
// the instances' Leases live and how objects are spread over them.
package apis
