package assign

import (
	"context"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

// ringRunner runs the machinery of one ring in its assignment unit: the
// ringAssigner of a ring of unit Objects (its caches, its workers that
// write the shard and drain labels, its status), the slotRing of a ring of
// unit Slots (its slot labeler and its status; the slot table is the slot
// table controller's). The Controller starts, reconfigures and stops either
// alike.
type ringRunner interface {
	// unit is the assignment unit the runner serves.
	unit() string
	// start runs the ring until stop or ctx is done.
	start(ctx context.Context)
	// stop stops the ring and waits for its goroutines.
	stop()
	// config returns the configuration the ring is served with.
	config() *ringConfig
	// keeps reports whether the runner can serve cfg without being built
	// again: the same watches.
	keeps(cfg *ringConfig) bool
	// reconfigure takes a new configuration the runner keeps.
	reconfigure(cfg *ringConfig)
	// notServed reports whether a resource of the ring was found not
	// served since it was resolved: discovery is asked again.
	notServed() bool
	// notifyMembership tells the runner that the ring's membership
	// changed; it never blocks.
	notifyMembership()
}

// ringUnit is what the Controller does differently per unit.
type ringUnit struct {
	name string
	// refuse returns the reason and message of a ring the unit cannot
	// serve as it is (nil: none).
	refuse func(ring *v1alpha1.ControllerRing) (reason, message string)
	// build makes the runner of ring, resolved as cfg.
	build func(c *Controller, ring *v1alpha1.ControllerRing, cfg *ringConfig) (ringRunner, error)
	// done is what happens to the ring's objects: "assigned", "labelled".
	done string
	// started and restarting are the log messages of a runner started,
	// and of one built again for new watches.
	started, restarting string
}

var (
	objectRings = ringUnit{
		name: v1alpha1.AssignmentUnitObjects,
		refuse: func(ring *v1alpha1.ControllerRing) (string, string) {
			if msg := unknownAlgorithm(ring.Spec.EffectiveAlgorithm()); msg != "" {
				return v1alpha1.ReasonUnknownAlgorithm, msg
			}
			return "", ""
		},
		build: func(c *Controller, _ *v1alpha1.ControllerRing, cfg *ringConfig) (ringRunner, error) {
			return newRingAssigner(c, cfg), nil
		},
		done:       "assigned",
		started:    "Ring assignment started",
		restarting: "Ring resources changed: restarting its caches",
	}
	slotRings = ringUnit{
		name: v1alpha1.AssignmentUnitSlots,
		build: func(c *Controller, ring *v1alpha1.ControllerRing, cfg *ringConfig) (ringRunner, error) {
			return newSlotRing(c, ring, cfg)
		},
		done:       "labelled",
		started:    "Ring slot labeling started",
		restarting: "Ring resources or namespaces changed: restarting its slot labeler",
	}
)

var (
	_ ringRunner = &ringAssigner{}
	_ ringRunner = &slotRing{}
)

func (*ringAssigner) unit() string { return v1alpha1.AssignmentUnitObjects }

func (r *ringAssigner) keeps(cfg *ringConfig) bool { return r.config().sameWatches(cfg) }

func (*slotRing) unit() string { return v1alpha1.AssignmentUnitSlots }

func (s *slotRing) keeps(cfg *ringConfig) bool { return s.sameLabeler(cfg) }

// notServed is false: the slot labeler reports its resources' problems
// itself, and discovery is asked again only for resources unknown when the
// ring was resolved.
func (*slotRing) notServed() bool { return false }
