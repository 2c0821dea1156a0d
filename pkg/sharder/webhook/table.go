package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/sharder/metrics"
	"github.com/sharder-dev/sharder/pkg/slots"
)

// TablePathPrefix is the URL path under which the slot table handler is
// served; the ring's name follows it.
const TablePathPrefix = "/validate-slot-table/"

// Reasons of the slot table handler's decisions.
const (
	reasonTableUnchanged = "slot-table-unchanged"
	reasonNotSharder     = "not-the-sharder"
	reasonTableUnread    = "slot-table-not-the-sharders"
)

// TableWebhookName is the name of the validating webhook that checks the
// sharder's writes of the slot table of a ring of unit Slots.
func TableWebhookName(ring string) string { return ring + ".slot-table.sharder.dev" }

// tableHandler checks the sharder's writes of a slot ring's table (updates
// of controllerrings/status) the way labelHandler checks its moves of a
// main object: a slot leaves an instance without its acknowledgement only
// while the instance is gone. The sharder decides such a grant under its
// hold of the instance's Lease; a write sent after the instance acquired
// its Lease again (a sharder paused between its decision and its write,
// for however long) would take the slot from under a running instance. So
// every instance that loses a slot in the write has its Lease read from the
// API server at admission: while it holds it, the write is denied unless
// the instance acknowledged every release it loses.
type tableHandler struct {
	apiReader client.Reader // Leases, uncached
	identity  *identity
}

// Handle implements admission.Handler.
func (h *tableHandler) Handle(ctx context.Context, req admission.Request) admission.Response {
	start := time.Now()
	path, _ := ctx.Value(pathKey{}).(string)
	ringName, ok := ringAfter(TablePathPrefix, path)
	if !ok {
		return admission.Errored(http.StatusNotFound, fmt.Errorf("path %q names no ring", path))
	}
	resp := h.handle(ctx, req, ringName)
	metrics.WebhookDecisionDuration.WithLabelValues(ringName).Observe(time.Since(start).Seconds())
	return resp
}

func (h *tableHandler) handle(ctx context.Context, req admission.Request, ringName string) admission.Response {
	log := logf.FromContext(ctx).WithValues("ring", ringName, "user", req.UserInfo.Username)
	var oldRing, newRing v1alpha1.ControllerRing
	if err := json.Unmarshal(req.OldObject.Raw, &oldRing); err != nil {
		metrics.WebhookDecisionsTotal.WithLabelValues(ringName, metrics.WebhookDenied, reasonBadRequest).Inc()
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding the old ControllerRing: %w", err))
	}
	if err := json.Unmarshal(req.Object.Raw, &newRing); err != nil {
		metrics.WebhookDecisionsTotal.WithLabelValues(ringName, metrics.WebhookDenied, reasonBadRequest).Inc()
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding the ControllerRing: %w", err))
	}
	policy := failurePolicy(&newRing.Spec)
	fault := func(err error) admission.Response {
		metrics.WebhookDecisionsTotal.WithLabelValues(ringName, metrics.WebhookFault, reasonError).Inc()
		log.Error(err, "Webhook cannot decide; applying the ring's failure policy", "failurePolicy", policy)
		if policy == admissionregistrationv1.Fail {
			return admission.Errored(http.StatusServiceUnavailable, fmt.Errorf("the sharder cannot check the slot table of ring %q now: %w", ringName, err))
		}
		return admission.Allowed("").WithWarnings(fmt.Sprintf(
			"the sharder could not check this write of the slot table of ring %q and let it through (failure policy Ignore): %v", ringName, err))
	}

	id, err := h.identity.get(ctx)
	if err != nil {
		return fault(err)
	}
	if req.UserInfo.Username != id {
		// Tables written by others are the slot table controller's to
		// judge (an invalid table, a table that went back).
		return answer(ringName, verdict{allowed: true, reason: reasonNotSharder})
	}
	count := newRing.Spec.EffectiveSlotCount()
	oldTable, oldErr := slots.FromStatus(count, oldRing.Status.Slots)
	newTable, newErr := slots.FromStatus(count, newRing.Status.Slots)
	if oldErr != nil || newErr != nil || !newRing.Spec.AssignsSlots() {
		// Not a table the sharder decides on or writes.
		return answer(ringName, verdict{allowed: true, reason: reasonTableUnread})
	}
	leaving := slots.Leaving(oldTable, newTable)
	if len(leaving) == 0 {
		return answer(ringName, verdict{allowed: true, reason: reasonTableUnchanged})
	}
	for _, holder := range slices.Sorted(maps.Keys(leaving)) {
		lease, err := liveLease(ctx, h.apiReader, &newRing, holder)
		if err != nil {
			return fault(err)
		}
		if v := tableHeldByInstance(&newRing, holder, leaving[holder], lease); !v.allowed {
			log.V(1).Info("Denied a slot table write", "reason", v.reason, "instance", holder)
			return answer(ringName, v)
		}
	}
	return answer(ringName, verdict{allowed: true, reason: reasonSharder})
}

// tableHeldByInstance decides whether the slots instance id loses in a
// write of ring's table may leave it, given what it must have acknowledged
// (slots.Leaving) and its Lease as read at admission (nil: absent, or not
// the ring's): allowed unless the instance holds its Lease and has not
// acknowledged that far.
func tableHeldByInstance(ring *v1alpha1.ControllerRing, id string, need int64, lease *coordinationv1.Lease) verdict {
	if lease == nil || ptr.Deref(lease.Spec.HolderIdentity, "") != id {
		return verdict{allowed: true, reason: reasonSharder}
	}
	acknowledged := slots.ParseAcknowledgement(lease.Annotations[v1alpha1.AnnotationSlotsAcknowledged], ring.UID)
	if need != slots.Unacknowledged && acknowledged >= need {
		return verdict{allowed: true, reason: reasonSharder}
	}
	what := "a slot granted to it"
	if need != slots.Unacknowledged {
		what = fmt.Sprintf("slots it was asked to release at revision %d, and it acknowledged revision %d", need, acknowledged)
	}
	return verdict{reason: reasonInstanceBack, message: fmt.Sprintf(
		"the sharder takes %s from instance %q of ring %q without its acknowledgement only while the instance is gone, "+
			"and the instance holds its Lease again: this table was decided before it came back and must not land; "+
			"the sharder decides again", what, id, ring.Name)}
}

// liveLease reads the Lease of instance id of ring from the API server,
// not a cache; nil when there is none in the ring (absent, not labelled for
// the ring) or id cannot name one.
func liveLease(ctx context.Context, reader client.Reader, ring *v1alpha1.ControllerRing, id string) (*coordinationv1.Lease, error) {
	if membership.InvalidID(id) != nil {
		return nil, nil //nolint:nilerr // a label value that names no instance names no Lease
	}
	lease := &coordinationv1.Lease{}
	err := reader.Get(ctx, types.NamespacedName{Namespace: ring.Spec.LeaseNamespace, Name: id}, lease)
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading the Lease of instance %q: %w", id, err)
	}
	if lease.Labels[v1alpha1.LabelRing] != ring.Name {
		return nil, nil
	}
	return lease, nil
}
