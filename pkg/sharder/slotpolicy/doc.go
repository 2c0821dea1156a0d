// Package slotpolicy builds what binds the slot label's admission policy to
// a ring in slot mode (docs/design.md §11). The policy,
// slot-label.sharder.dev, is installed with the sharder (config/policy, the
// chart); the sharder writes one binding per ring of unit Slots, built by
// Binding, so that the policy guards exactly the ring's resources in the
// ring's namespaces, with the ring as its parameter.
package slotpolicy
