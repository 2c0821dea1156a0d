package webhook

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/sharder/metrics"
)

// AssignPathPrefix is the URL path under which the assigning handler is
// served; the ring's name follows it.
const AssignPathPrefix = "/assign-shard/"

// Reasons of the assigning handler (the "reason" label of its metric).
const (
	assignReasonAssigned  = "assigned"
	assignReasonUnplaced  = "unplaced"
	assignReasonLabelled  = "already-labelled"
	assignReasonNotCreate = "not-a-create"
	assignReasonWatchMode = "watch-mode"
)

// assignHandler answers the create requests of rings in admission mode
// (spec.assignment.mode Admission) with a patch adding the shard label of
// the instance the sharder would choose. It chooses exactly as the
// validating handler checks (labelHandler.choose), so the label it adds is
// the one the validating webhook allows next. When it cannot place the
// object (no ready instance, a controlled object whose controller is not
// assigned yet or not readable, caches not synced) it lets the create
// through unlabelled and the sharder assigns the object from its watch.
// It never denies a request.
type assignHandler struct {
	labels *labelHandler
}

// ringAfter returns the ring a request's path names: the one path
// element after prefix.
func ringAfter(prefix, path string) (string, bool) {
	name, ok := strings.CutPrefix(path, prefix)
	if !ok || name == "" || strings.Contains(name, "/") {
		return "", false
	}
	return name, true
}

// Handle implements admission.Handler.
func (h *assignHandler) Handle(ctx context.Context, req admission.Request) admission.Response {
	start := time.Now()
	path, _ := ctx.Value(pathKey{}).(string)
	ringName, ok := ringAfter(AssignPathPrefix, path)
	if !ok {
		return admission.Errored(http.StatusNotFound, fmt.Errorf("path %q names no ring", path))
	}
	resp, reason := h.handle(ctx, req, ringName)
	result := metrics.WebhookSkipped
	if reason == assignReasonAssigned {
		result = metrics.WebhookAssigned
	}
	metrics.WebhookAssignmentsTotal.WithLabelValues(ringName, result, reason).Inc()
	metrics.WebhookAssignmentDuration.WithLabelValues(ringName).Observe(time.Since(start).Seconds())
	return resp
}

func (h *assignHandler) handle(ctx context.Context, req admission.Request, ringName string) (admission.Response, string) {
	log := logf.FromContext(ctx).WithValues("ring", ringName, "resource", req.Resource, "object", klog.KRef(req.Namespace, req.Name))
	// Whatever goes wrong, the object is created: the sharder assigns it.
	skip := func(reason string, err error) (admission.Response, string) {
		if err != nil {
			log.Error(err, "Cannot assign the new object; the sharder assigns it from its watch")
		}
		return admission.Allowed(""), reason
	}
	if req.Operation != admissionv1.Create || req.SubResource != "" {
		return skip(assignReasonNotCreate, nil)
	}
	obj, err := decodeMetadata(req.Object.Raw)
	if err != nil {
		return skip(reasonBadRequest, fmt.Errorf("decoding the object's metadata: %w", err))
	}
	if hasRingLabel(obj, ringName) {
		return skip(assignReasonLabelled, nil)
	}
	if !h.labels.synced() {
		return skip(reasonNotSynced, nil)
	}
	rg, err := h.labels.ring(ctx, ringName)
	if err != nil {
		if apierrors.IsNotFound(err) {
			return skip(reasonUnknownRing, nil)
		}
		return skip(reasonError, err)
	}
	patch, reason, err := assignment(rg, obj, func() (string, string, error) {
		if rg.Spec.AssignsSlots() {
			return h.labels.chooseSlot(ctx, rg, req.Resource, req.Kind, obj)
		}
		return h.labels.choose(ctx, rg, req.Resource, req.Kind, obj, "") // an unlabelled create: the ring's pick
	})
	if err != nil {
		return skip(reason, err)
	}
	if patch == nil {
		if reason == assignReasonWatchMode || reason == assignReasonLabelled {
			return skip(reason, nil)
		}
		log.V(1).Info("Leaving the new object to the sharder", "why", reason)
		return skip(assignReasonUnplaced, nil)
	}
	return admission.Patched("", *patch), assignReasonAssigned
}

// assignment answers the creation of obj in ring rg: the patch adding the
// shard label of the instance choose picks (a ring of unit Slots: the slot
// label of the slot it computes), or none with the reason (a metric
// reason, or why choose found no value). It never guesses: no instance or
// slot, no label.
func assignment(rg *v1alpha1.ControllerRing, obj *metav1.PartialObjectMetadata, choose choice) (*jsonpatch.JsonPatchOperation, string, error) {
	label := v1alpha1.ShardLabel(rg.Name)
	if rg.Spec.AssignsSlots() {
		label = v1alpha1.SlotLabel(rg.Name)
	}
	switch {
	case !rg.Spec.AssignsAtAdmission():
		// The configuration lags behind a ring switched back to watch mode.
		return nil, assignReasonWatchMode, nil
	case hasRingLabel(obj, rg.Name):
		return nil, assignReasonLabelled, nil
	case rg.Spec.AssignsSlots() && obj.Labels[label] != "":
		// Its creator set the slot: the slot label policy judges it.
		return nil, assignReasonLabelled, nil
	}
	value, why, err := choose()
	if err != nil {
		return nil, reasonError, err
	}
	if value == "" {
		return nil, why, nil
	}
	op := labelPatch(obj.Labels, label, value)
	return &op, assignReasonAssigned, nil
}

// hasRingLabel reports whether obj carries the ring's shard or drain label:
// such a creation is the validating webhook's to judge, not to be changed.
func hasRingLabel(obj *metav1.PartialObjectMetadata, ringName string) bool {
	_, shard := obj.Labels[v1alpha1.ShardLabel(ringName)]
	_, drain := obj.Labels[v1alpha1.DrainLabel(ringName)]
	return shard || drain
}

// labelPatch is the JSON patch operation adding label key=value to an
// object whose labels are labels (RFC 6901 escapes '~' and '/' in the key).
func labelPatch(labels map[string]string, key, value string) jsonpatch.JsonPatchOperation {
	if labels == nil {
		return jsonpatch.NewOperation("add", "/metadata/labels", map[string]string{key: value})
	}
	escaped := strings.NewReplacer("~", "~0", "/", "~1").Replace(key)
	return jsonpatch.NewOperation("add", "/metadata/labels/"+escaped, value)
}
