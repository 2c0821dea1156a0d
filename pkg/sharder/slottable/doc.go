// Package slottable is the sharder's slot table controller (docs/design.md
// §11): for every ring of unit Slots it decides the ring's slot table with
// slots.Step, from the table in the ring's status, the ring's members as the
// lease controller publishes them and the acknowledgements on their Leases,
// and writes the next table into the ring's status, locked on the ring's
// resourceVersion. It tells the lease controller how many slots each
// instance holds (Registry.SetAssigned), so that a dead instance's Lease is
// held while its slots are granted away, and writes the ring's binding of
// the slot label policy.
package slottable
