// Package simulation evaluates ring algorithms offline: how evenly a
// membership shares a set of keys, and how many keys a membership change
// moves compared with the fewest it could move. `sharder simulate` and the
// ring benchmarks are built on it.
//
// Run builds the rings of Options and returns a Result; InstanceNames and
// Keys generate deterministic memberships and key sets from a seed.
package simulation
