// Package slots is slot mode without I/O (docs/design.md §11): a ring of
// unit Slots labels every object once with its slot, and the sharder
// assigns the ring's slots, not its objects, to instances.
//
// Most callers need:
//
//   - ForMainObject: the slot of a main object of a ring, from its hash key
//     (v1alpha1.ObjectKey) or its namespace as the ring says (ForObjectKey,
//     ForNamespace); ParseLabel: the slot a slot label names.
//   - Table, FromStatus and Table.Status: the slot table, as the ring's
//     status carries it (v1alpha1.SlotTable).
//   - Plan: where each slot belongs, from the table and the ready
//     instances with their weights: balanced to within one slot of the
//     weighted ideal, moving as few slots as such a balance allows.
//   - Step: the table's state machine as one pure decision: which slots
//     to grant, release, take back, or grant after an acknowledgement, and
//     which instances to fence, from the table, the instances' states and
//     acknowledgements, and the time.
//   - Record: an instance's own record of its slots, following newer
//     tables only; FormatAcknowledgement and ParseAcknowledgement: the
//     acknowledgement on its Lease.
//   - Group, GroupSelectors and ShardSelector: how an instance selects its
//     slots, one watch per group, with a label selector or the API server's
//     shard selector.
package slots
