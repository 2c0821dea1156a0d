package assign

import (
	"fmt"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/sharder/assign/internal/metacache"
)

// This file holds the parts of a ring's status both units write alike: the
// Ready condition and the members.

// readyWords are the words a unit's Ready condition uses for its work.
type readyWords struct {
	// meanwhile ends the message of a resource problem: what happens to
	// the ring's other resources.
	meanwhile string
	// loading is the message while the caches load.
	loading string
	// noInstance ends the message when no instance is ready.
	noInstance string
}

var (
	objectWords = readyWords{
		meanwhile:  "The ring's other resources are assigned meanwhile.",
		loading:    "The sharder is loading the ring's objects; assignment starts once its caches are synced.",
		noInstance: "objects stay unassigned until one does.",
	}
	slotWords = readyWords{
		meanwhile:  "The ring's other resources are labelled meanwhile.",
		loading:    "The sharder is loading the ring's objects without a slot label; labelling starts once its caches are synced.",
		noInstance: "slots stay where they are until one does.",
	}
)

// readyCondition is the ring's Ready condition: False with the most
// actionable problem of a resource (a missing resource, then a missing
// permission), while the caches load, or while no instance is ready; True
// otherwise.
func readyCondition(name string, cfg *ringConfig, problems []metacache.Problem, synced bool, available int32, words readyWords) metav1.Condition {
	cond := metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, ObservedGeneration: cfg.generation}
	if len(problems) > 0 {
		problems = slices.Clone(problems)
		slices.SortStableFunc(problems, func(a, b metacache.Problem) int { return strings.Compare(b.Reason, a.Reason) })
		cond.Reason = problems[0].Reason
		msgs := make([]string, 0, len(problems))
		for _, p := range problems {
			msgs = append(msgs, p.Message)
		}
		cond.Message = strings.Join(msgs, "; ") + ". " + words.meanwhile
		return cond
	}
	switch {
	case !synced:
		cond.Reason = v1alpha1.ReasonCachesNotSynced
		cond.Message = words.loading
	case available == 0:
		cond.Reason = v1alpha1.ReasonNoReadyInstances
		cond.Message = fmt.Sprintf("No instance of the ring holds a ready Lease in namespace %q labelled %s=%s: %s",
			cfg.leaseNamespace, v1alpha1.LabelRing, name, words.noInstance)
	default:
		cond.Status = metav1.ConditionTrue
		cond.Reason = v1alpha1.ReasonReady
		cond.Message = "Every resource of the ring is watched and at least one instance is ready."
	}
	return cond
}

// setMembers fills status's members, instances and available instances
// from members, each member's entry completed by fill (its objects or its
// slots), and returns the count of members per state.
func setMembers(status *v1alpha1.ControllerRingStatus, members []membership.Member, virtualNodes int, fill func(*v1alpha1.MemberStatus)) map[membership.State]int {
	byState := map[membership.State]int{}
	status.Members = make([]v1alpha1.MemberStatus, 0, len(members))
	status.AvailableInstances = 0
	for _, m := range members {
		byState[m.State]++
		if m.State == membership.StateReady {
			status.AvailableInstances++
		}
		ms := v1alpha1.MemberStatus{
			Name:         m.ID,
			State:        string(m.State),
			VirtualNodes: int32(m.Weight(virtualNodes)), //nolint:gosec // bounded by the CRD and the Lease label parser
		}
		fill(&ms)
		status.Members = append(status.Members, ms)
	}
	if len(status.Members) == 0 {
		status.Members = nil
	}
	status.Instances = int32(len(members)) //nolint:gosec // a handful of instances
	return byState
}
