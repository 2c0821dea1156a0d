package v1alpha1

import (
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// LabelNamespaceName is the label the API server sets on every Namespace to
// its own name; the default namespace selector matches on it.
const LabelNamespaceName = "kubernetes.io/metadata.name"

// DefaultNamespaceSelector returns the selector used when a ring sets none:
// every namespace except kube-system.
func DefaultNamespaceSelector() *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
		Key:      LabelNamespaceName,
		Operator: metav1.LabelSelectorOpNotIn,
		Values:   []string{metav1.NamespaceSystem},
	}}}
}

// NamespaceLabelSelector returns the ring's namespace selector (or the
// default) as a labels.Selector. An empty selector ({}) selects every
// namespace. A malformed selector gives an error naming the field.
func (s *ControllerRingSpec) NamespaceLabelSelector() (labels.Selector, error) {
	ls := s.NamespaceSelector
	if ls == nil {
		ls = DefaultNamespaceSelector()
	}
	sel, err := metav1.LabelSelectorAsSelector(ls)
	if err != nil {
		return nil, fmt.Errorf("spec.namespaceSelector: %w", err)
	}
	return sel, nil
}

// EffectiveAlgorithm returns spec.algorithm, or DefaultAlgorithm when empty.
func (s *ControllerRingSpec) EffectiveAlgorithm() string {
	if s.Algorithm == "" {
		return DefaultAlgorithm
	}
	return s.Algorithm
}

// EffectiveVirtualNodes returns spec.virtualNodes, or DefaultVirtualNodes
// when unset or not positive.
func (s *ControllerRingSpec) EffectiveVirtualNodes() int {
	if s.VirtualNodes == nil || *s.VirtualNodes < 1 {
		return DefaultVirtualNodes
	}
	return int(*s.VirtualNodes)
}

// EffectiveDrainTimeout returns spec.drainTimeout, or DefaultDrainTimeout
// seconds when unset or not positive.
func (s *ControllerRingSpec) EffectiveDrainTimeout() time.Duration {
	if s.DrainTimeout == nil || s.DrainTimeout.Duration <= 0 {
		return DefaultDrainTimeout * time.Second
	}
	return s.DrainTimeout.Duration
}

// EffectiveRestartHold returns spec.restartHold, or DefaultRestartHold
// seconds when unset; 0 (or a negative value) turns the hold off.
func (s *ControllerRingSpec) EffectiveRestartHold() time.Duration {
	if s.RestartHold == nil {
		return DefaultRestartHold * time.Second
	}
	return max(s.RestartHold.Duration, 0)
}

// AssignsAtAdmission reports whether spec.assignment.mode is Admission.
func (s *ControllerRingSpec) AssignsAtAdmission() bool {
	return s.Assignment != nil && s.Assignment.Mode == AssignmentAdmission
}

// AssignsSlots reports whether spec.assignment.unit is Slots.
func (s *ControllerRingSpec) AssignsSlots() bool {
	return s.Assignment != nil && s.Assignment.Unit == AssignmentUnitSlots
}

// EffectiveSlotCount returns spec.assignment.slots.count, or
// DefaultSlotCount when unset or not positive.
func (s *ControllerRingSpec) EffectiveSlotCount() int {
	if s.Assignment == nil || s.Assignment.Slots == nil || s.Assignment.Slots.Count < 1 {
		return DefaultSlotCount
	}
	return int(s.Assignment.Slots.Count)
}

// EffectiveSlotKey returns spec.assignment.slots.key, or SlotKeyObject when
// unset.
func (s *ControllerRingSpec) EffectiveSlotKey() string {
	if s.Assignment == nil || s.Assignment.Slots == nil || s.Assignment.Slots.Key == "" {
		return SlotKeyObject
	}
	return s.Assignment.Slots.Key
}
