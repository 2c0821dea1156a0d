package metrics

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// collectors returns every metric family of the sharder.
func collectors() []prometheus.Collector {
	return []prometheus.Collector{
		RingInfo, Instances, Objects, UnassignedObjects,
		AssignmentsTotal, MovesTotal,
		DrainsTotal, DrainsInFlight, DrainDuration,
		AssignmentLatency, RingRebuildsTotal,
		LeaseTransitionsTotal, LeaseTakeoversTotal, LeasesDeletedTotal,
		WebhookDecisionsTotal, WebhookDecisionDuration,
		WebhookAssignmentsTotal, WebhookAssignmentDuration,
		Slots, SlotMovesTotal, SlotFencesTotal, SlotReleaseDuration,
	}
}

// Register registers every metric family of the sharder with r; `sharder
// run` passes controller-runtime's metrics.Registry, which the manager's
// metrics endpoint serves. Importing the package registers nothing: a
// process that only embeds parts of the project (an instance) does not get
// the sharder's families. Registering the same families with the same r again
// is not an error; a different collector of the same name is.
func Register(r prometheus.Registerer) error {
	var errs []error
	for _, c := range collectors() {
		err := r.Register(c)
		var already prometheus.AlreadyRegisteredError
		if errors.As(err, &already) && already.ExistingCollector == c {
			continue
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("registering the sharder's metrics: %w", err)
	}
	return nil
}
