package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/ring"
	"github.com/sharder-dev/sharder/pkg/sharder/metrics"
)

// +kubebuilder:rbac:groups=sharder.dev,resources=controllerrings,verbs=get;list;watch
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=selfsubjectreviews,verbs=create

// labelHandler decides admission requests for one ring, named by the request's
// path (PathPrefix + "<ring>/<failure policy>"). It reads only metadata:
// rings and instance Leases from the manager's cache, and, for a new
// controlled object that carries a shard label, its owner's metadata from the
// API server.
type labelHandler struct {
	cache     client.Reader // rings and Leases
	apiReader client.Reader // owners, uncached
	mapper    meta.RESTMapper
	synced    func() bool // the cache's ring and Lease informers have synced
	identity  *identity
	clock     clock.PassiveClock
	// leader returns the identity of the replica that leads, or "" and why
	// none is known; nil when the sharder's writes are not fenced
	// (Options.LeaderLease unset).
	leader func() (string, string)

	// builds keeps each ring's membership as this replica observes it, as
	// the sharder does, and the ring built from it off the request path.
	builds *ringBuilds
}

type pathKey struct{}

// withPath puts the request's URL path into the context for Handle.
func withPath(ctx context.Context, r *http.Request) context.Context {
	return context.WithValue(ctx, pathKey{}, r.URL.Path)
}

// ringFromPath returns the ring name and the failure policy the
// configuration was built with.
func ringFromPath(path string) (string, admissionregistrationv1.FailurePolicyType, bool) {
	rest, ok := strings.CutPrefix(path, PathPrefix)
	if !ok {
		return "", "", false
	}
	name, policy, _ := strings.Cut(rest, "/")
	if name == "" {
		return "", "", false
	}
	if strings.EqualFold(policy, string(admissionregistrationv1.Fail)) {
		return name, admissionregistrationv1.Fail, true
	}
	return name, admissionregistrationv1.Ignore, true
}

// ringPath is the path the configuration sends a ring's requests to.
func ringPath(name string, policy admissionregistrationv1.FailurePolicyType) string {
	return PathPrefix + name + "/" + strings.ToLower(string(policy))
}

// Handle implements admission.Handler.
func (h *labelHandler) Handle(ctx context.Context, req admission.Request) admission.Response {
	start := time.Now()
	path, _ := ctx.Value(pathKey{}).(string)
	ringName, policy, ok := ringFromPath(path)
	if !ok {
		return admission.Errored(http.StatusNotFound, fmt.Errorf("path %q names no ring", path))
	}
	resp := h.handle(ctx, req, ringName, policy)
	metrics.WebhookDecisionDuration.WithLabelValues(ringName).Observe(time.Since(start).Seconds())
	return resp
}

func (h *labelHandler) handle(ctx context.Context, req admission.Request, ringName string, policy admissionregistrationv1.FailurePolicyType) admission.Response {
	log := logf.FromContext(ctx).WithValues("ring", ringName, "resource", req.Resource, "subResource", req.SubResource,
		"object", klog.KRef(req.Namespace, req.Name), "operation", req.Operation, "user", req.UserInfo.Username)

	newMeta, err := decodeMetadata(req.Object.Raw)
	if err != nil {
		metrics.WebhookDecisionsTotal.WithLabelValues(ringName, metrics.WebhookDenied, reasonBadRequest).Inc()
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding the object's metadata: %w", err))
	}
	var oldMeta *metav1.PartialObjectMetadata
	if req.Operation == admissionv1.Update {
		if oldMeta, err = decodeMetadata(req.OldObject.Raw); err != nil {
			metrics.WebhookDecisionsTotal.WithLabelValues(ringName, metrics.WebhookDenied, reasonBadRequest).Inc()
			return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding the old object's metadata: %w", err))
		}
	}
	shard, drain := v1alpha1.ShardLabel(ringName), v1alpha1.DrainLabel(ringName)
	lr := labelRequest{
		ring: ringName, op: req.Operation, username: req.UserInfo.Username,
		pods:     req.UserInfo.Extra[serviceaccount.PodNameKey],
		newShard: labelOf(newMeta.Labels, shard), newDrain: labelOf(newMeta.Labels, drain),
	}
	if oldMeta != nil {
		lr.oldShard, lr.oldDrain = labelOf(oldMeta.Labels, shard), labelOf(oldMeta.Labels, drain)
	}
	lr.fieldManager = fieldManagerOf(req.Options.Raw)
	if !lr.shardChanged() && !lr.drainChanged() {
		return answer(ringName, verdict{allowed: true, reason: reasonUnchanged})
	}

	fault := func(reason string, err error) admission.Response {
		metrics.WebhookDecisionsTotal.WithLabelValues(ringName, metrics.WebhookFault, reason).Inc()
		log.Error(err, "Webhook cannot decide; applying the ring's failure policy", "failurePolicy", policy)
		if policy == admissionregistrationv1.Fail {
			return admission.Errored(http.StatusServiceUnavailable, fmt.Errorf("the sharder cannot check labels of ring %q now: %w", ringName, err))
		}
		return admission.Allowed("").WithWarnings(fmt.Sprintf(
			"the sharder could not check this change to the labels of ring %q and let it through (failure policy Ignore): %v", ringName, err))
	}

	id, err := h.identity.get(ctx)
	if err != nil {
		return fault(reasonError, err)
	}
	if !h.synced() {
		return fault(reasonNotSynced, errors.New("caches not synced yet"))
	}
	rg, err := h.ring(ctx, ringName)
	if err != nil {
		if apierrors.IsNotFound(err) {
			return fault(reasonUnknownRing, fmt.Errorf("ControllerRing %q not found", ringName))
		}
		return fault(reasonError, err)
	}
	policy = failurePolicy(&rg.Spec)

	choose := func() (string, string, error) {
		return h.choose(ctx, rg, req.Resource, req.Kind, newMeta, lr.newShard.value)
	}
	podOf := func(instance string) (string, string, error) {
		return h.instancePod(ctx, rg, instance)
	}
	v, err := admit(lr, rg, sharderOf{identity: id, leader: h.leader}, choose, podOf)
	if err != nil {
		return fault(reasonError, err)
	}
	if v.allowed && v.reason == reasonSharder && lr.movesOff() &&
		rg.Spec.IsMainResource(schema.GroupResource{Group: req.Resource.Group, Resource: req.Resource.Resource}) {
		holder, present, err := h.leaseHolder(ctx, rg, lr.oldShard.value)
		if err != nil {
			return fault(reasonError, err)
		}
		v = heldByInstance(lr, holder, present)
	}
	if !v.allowed {
		log.V(1).Info("Denied a change to ring labels", "reason", v.reason)
	}
	return answer(ringName, v)
}

// leaseHolder reads the Lease of instance id of rg from the API server,
// not the cache: a move is checked against the Lease as it is when the move
// is admitted. It returns its holder, and false when there is no such Lease
// in the ring (absent, or not labelled for the ring) or id cannot name one.
func (h *labelHandler) leaseHolder(ctx context.Context, rg *v1alpha1.ControllerRing, id string) (string, bool, error) {
	lease, err := liveLease(ctx, h.apiReader, rg, id)
	if err != nil || lease == nil {
		return "", false, err
	}
	return ptr.Deref(lease.Spec.HolderIdentity, ""), true, nil
}

// answer is the response to a verdict, counted by ring and reason.
func answer(ringName string, v verdict) admission.Response {
	if v.allowed {
		metrics.WebhookDecisionsTotal.WithLabelValues(ringName, metrics.WebhookAllowed, v.reason).Inc()
		return admission.Allowed(v.reason)
	}
	metrics.WebhookDecisionsTotal.WithLabelValues(ringName, metrics.WebhookDenied, v.reason).Inc()
	return admission.Denied(v.message)
}

// choose returns the instance a new object may be created with: for an
// object of a main resource, requested when it is a ready instance of the
// ring, else the ring's lookup of its key over the ready instances; for an
// object of a controlled resource, its controller's current instance.
//
// A main object labelled for a ready instance that is not the ring's pick
// is allowed because two choices made a moment apart can differ while the
// ready instances change (the assigning webhook's and this one, or two
// replicas' caches): denying would fail the create. The sharder moves such
// an object to its pick with a drain, as any object whose instance is no
// longer the ring's pick. A controlled object must follow its controller:
// there is no drain of its own to move it safely.
func (h *labelHandler) choose(ctx context.Context, rg *v1alpha1.ControllerRing, gvr metav1.GroupVersionResource, gvk metav1.GroupVersionKind,
	obj *metav1.PartialObjectMetadata, requested string) (string, string, error) {
	gr := schema.GroupResource{Group: gvr.Group, Resource: gvr.Resource}
	switch {
	case rg.Spec.IsMainResource(gr):
		if obj.Name == "" {
			return "", "the object has no name yet", nil
		}
		return h.mainChoice(rg, gvk, obj, requested)
	case rg.Spec.IsControlledResource(gr):
		return h.ownerInstance(ctx, rg, obj)
	}
	return "", fmt.Sprintf("%s is not a resource of the ring", schema.GroupResource{Group: gvr.Group, Resource: gvr.Resource}), nil
}

// mainInstance returns the instance r maps a new main object to; none,
// with why, when r has no ready instance.
func mainInstance(r ring.Ring, gvk metav1.GroupVersionKind, obj *metav1.PartialObjectMetadata) (string, string, error) {
	instance, err := ring.LookupObject(r, gvk.Group, gvk.Kind, obj.Namespace, obj.Name)
	if errors.Is(err, ring.ErrNoInstance) {
		return "", "the ring has no ready instance", nil
	}
	if err != nil {
		return "", "", fmt.Errorf("looking up the instance of %s %s/%s: %w", gvk.Kind, obj.Namespace, obj.Name, err)
	}
	return instance, "", nil
}

// instancePod names the pod of an instance: the Pod ownerReference of its
// Lease, else (no Lease, or a Lease without a Pod owner) a pod named like the
// instance, which is the default instance ID.
func (h *labelHandler) instancePod(ctx context.Context, rg *v1alpha1.ControllerRing, instance string) (string, string, error) {
	lease := &coordinationv1.Lease{}
	err := h.cache.Get(ctx, types.NamespacedName{Namespace: rg.Spec.LeaseNamespace, Name: instance}, lease)
	if apierrors.IsNotFound(err) {
		return "", instance, nil
	}
	if err != nil {
		return "", "", fmt.Errorf("reading the Lease of instance %q: %w", instance, err)
	}
	for _, ref := range lease.OwnerReferences {
		if ref.Kind == "Pod" && ref.APIVersion == "v1" {
			return lease.Namespace, ref.Name, nil
		}
	}
	return "", instance, nil
}

// ownerInstance returns the shard label of the object's controller.
func (h *labelHandler) ownerInstance(ctx context.Context, rg *v1alpha1.ControllerRing, obj *metav1.PartialObjectMetadata) (string, string, error) {
	return h.controllerLabel(ctx, rg, obj, v1alpha1.ShardLabel(rg.Name), "is not assigned to an instance yet")
}

// controllerLabel returns the value of label on the object's controller,
// read from the API server; none, with why, when the object has no
// controller of the ring or its controller does not carry the label (why
// then ends with unset).
func (h *labelHandler) controllerLabel(ctx context.Context, rg *v1alpha1.ControllerRing, obj *metav1.PartialObjectMetadata, label, unset string) (string, string, error) {
	ref := metav1.GetControllerOfNoCopy(obj)
	if ref == nil {
		return "", "the object has no controller ownerReference", nil
	}
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	if err != nil {
		// A malformed reference is the request's fault: deny, do not fail.
		return "", fmt.Sprintf("its controller's apiVersion %q is malformed: %v", ref.APIVersion, err), nil
	}
	gvk := gv.WithKind(ref.Kind)
	mapping, err := h.mapper.RESTMapping(gvk.GroupKind(), gv.Version)
	if meta.IsNoMatchError(err) {
		return "", fmt.Sprintf("its controller's kind %s is not served", gvk), nil
	}
	if err != nil {
		return "", "", fmt.Errorf("mapping the controller's kind %s: %w", gvk, err)
	}
	if gr := mapping.Resource.GroupResource(); !rg.Spec.IsMainResource(gr) && !rg.Spec.IsControlledResource(gr) {
		return "", fmt.Sprintf("its controller, a %s, is not a resource of the ring", mapping.Resource.GroupResource()), nil
	}
	owner := &metav1.PartialObjectMetadata{}
	owner.SetGroupVersionKind(gvk)
	key := types.NamespacedName{Name: ref.Name}
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		key.Namespace = obj.Namespace
	}
	if err := h.apiReader.Get(ctx, key, owner); err != nil {
		if apierrors.IsNotFound(err) {
			return "", fmt.Sprintf("its controller %s %s does not exist", ref.Kind, ref.Name), nil
		}
		return "", "", fmt.Errorf("reading the controller %s %s: %w", ref.Kind, key, err)
	}
	if owner.UID != ref.UID {
		return "", fmt.Sprintf("its controller %s %s is another object than the ownerReference names (uid %s)", ref.Kind, ref.Name, ref.UID), nil
	}
	value := owner.Labels[label]
	if value == "" {
		return "", fmt.Sprintf("its controller %s %s %s", ref.Kind, ref.Name, unset), nil
	}
	return value, "", nil
}

// mainChoice returns the instance a new main object may be created with:
// requested when it is ready now, else the pick of the ring built last,
// if that instance is ready now. The ring is built off the request path
// (ringBuilds), by the same function as the sharder's assignment builds
// its own, so the two agree on where an object belongs once both have seen
// the same membership; meanwhile no instance that is not ready is ever
// chosen.
func (h *labelHandler) mainChoice(rg *v1alpha1.ControllerRing, gvk metav1.GroupVersionKind, obj *metav1.PartialObjectMetadata, requested string) (string, string, error) {
	algorithm := rg.Spec.EffectiveAlgorithm()
	if !ring.Registered(algorithm) {
		return "", "", fmt.Errorf("building ring %q: %w %q (known: %v)", rg.Name, ring.ErrUnknownAlgorithm, algorithm, ring.Algorithms())
	}
	built := h.builds.built(rg.Name)
	if built != nil && built.err != nil {
		return "", "", built.err
	}
	now := h.clock.Now()
	if requested != "" && h.builds.ready(rg.Name, requested, now) {
		return requested, "", nil
	}
	if built == nil {
		return "", "the ring is still being built", nil
	}
	instance, why, err := mainInstance(built.ring, gvk, obj)
	if err != nil || instance == "" {
		return instance, why, err
	}
	if !h.builds.ready(rg.Name, instance, now) {
		return "", fmt.Sprintf("instance %q, the ring's pick, is no longer ready and the ring is being built again", instance), nil
	}
	return instance, "", nil
}

// ring returns the ring named name from the cache. It is the cached object
// itself, not a copy (its status lists every member): read only.
func (h *labelHandler) ring(ctx context.Context, name string) (*v1alpha1.ControllerRing, error) {
	rg := &v1alpha1.ControllerRing{}
	if err := h.cache.Get(ctx, types.NamespacedName{Name: name}, rg, client.UnsafeDisableDeepCopy); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, err
		}
		return nil, fmt.Errorf("reading ControllerRing %q: %w", name, err)
	}
	return rg, nil
}

// forget drops the metrics of a deleted ring.
func (h *labelHandler) forget(ringName string) {
	metrics.ForgetWebhookRing(ringName)
}

// fieldManagerOf returns the field manager of a request's options
// (CreateOptions, UpdateOptions or PatchOptions), "" if none.
func fieldManagerOf(raw []byte) string {
	if len(raw) == 0 {
		return ""
	}
	var opts struct {
		FieldManager string `json:"fieldManager"`
	}
	if err := json.Unmarshal(raw, &opts); err != nil {
		return ""
	}
	return opts.FieldManager
}

// decodeMetadata reads only the metadata of a JSON object.
func decodeMetadata(raw []byte) (*metav1.PartialObjectMetadata, error) {
	if len(raw) == 0 {
		return nil, errors.New("empty object")
	}
	var obj struct {
		metav1.TypeMeta `json:",inline"`
		Metadata        metav1.ObjectMeta `json:"metadata"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, err
	}
	return &metav1.PartialObjectMetadata{TypeMeta: obj.TypeMeta, ObjectMeta: obj.Metadata}, nil
}
