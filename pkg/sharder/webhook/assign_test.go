package webhook

import (
	"errors"
	"testing"

	"gomodules.xyz/jsonpatch/v2"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/ring"
	"github.com/sharder-dev/sharder/pkg/sharder/ringbuilds"
)

// TestAssignment: given a ring, its members and a new object, the
// assigning webhook adds the shard label of the instance the ring maps a
// main object to, or of a controlled object's controller, and nothing when
// it cannot know the answer.
func TestAssignment(t *testing.T) {
	const name = "web"
	shard := v1alpha1.ShardLabel(name)
	admission := v1alpha1.ControllerRing{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.ControllerRingSpec{
		Resources:  []v1alpha1.RingResource{{Resource: "configmaps"}},
		Assignment: &v1alpha1.RingAssignment{Mode: v1alpha1.AssignmentAdmission},
	}}
	watch := *admission.DeepCopy()
	watch.Spec.Assignment.Mode = v1alpha1.AssignmentWatch
	unset := *admission.DeepCopy()
	unset.Spec.Assignment = nil
	slots := *admission.DeepCopy()
	slots.Spec.Assignment.Unit = v1alpha1.AssignmentUnitSlots

	ready := []membership.Member{
		{ID: "inst-a", State: membership.StateReady},
		{ID: "inst-b", State: membership.StateReady},
		{ID: "inst-c", State: membership.StateExpired},
	}
	none := []membership.Member{{ID: "inst-c", State: membership.StateExpired}, {ID: "inst-d", State: membership.StateDead}}
	gvk := metav1.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}
	obj := func(labels map[string]string) *metav1.PartialObjectMetadata {
		return &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "settings", Labels: labels}}
	}
	// want computes the instance independently of the webhook: the ring the
	// sharder builds over the same members.
	want := func(members []membership.Member) string {
		ready, _ := ringbuilds.ReadyMembers(v1alpha1.DefaultAlgorithm, v1alpha1.DefaultVirtualNodes, members)
		r, err := ring.New(v1alpha1.DefaultAlgorithm, ready)
		if err != nil {
			t.Fatal(err)
		}
		instance, err := r.Lookup(ring.ObjectKey("", "ConfigMap", "team", "settings"))
		if err != nil {
			t.Fatal(err)
		}
		return instance
	}
	main := func(members []membership.Member) choice {
		return func() (string, string, error) {
			var rings ringbuilds.Builds
			r, _, err := rings.Build(name, v1alpha1.DefaultAlgorithm, v1alpha1.DefaultVirtualNodes, members)
			if err != nil {
				return "", "", err
			}
			return mainInstance(r, gvk, obj(nil))
		}
	}
	owner := func(instance, why string) choice {
		return func() (string, string, error) { return instance, why, nil }
	}
	failing := func() (string, string, error) { return "", "", errors.New("API server unreachable") }
	mustNotChoose := func() (string, string, error) {
		t.Error("choose called")
		return "", "", nil
	}

	for _, tc := range []struct {
		name      string
		ring      v1alpha1.ControllerRing
		obj       *metav1.PartialObjectMetadata
		choose    choice
		wantPatch *jsonpatch.JsonPatchOperation
		wantWhy   string
		wantErr   bool
	}{
		{name: "main object, no labels", ring: admission, obj: obj(nil), choose: main(ready),
			wantPatch: &jsonpatch.JsonPatchOperation{Operation: "add", Path: "/metadata/labels", Value: map[string]string{shard: want(ready)}}},
		{name: "main object with other labels", ring: admission, obj: obj(map[string]string{"app": "x"}), choose: main(ready),
			wantPatch: &jsonpatch.JsonPatchOperation{Operation: "add", Path: "/metadata/labels/shard.sharder.dev~1web", Value: want(ready)}},
		{name: "only ready instances count", ring: admission, obj: obj(nil), choose: main(ready[:1]),
			wantPatch: &jsonpatch.JsonPatchOperation{Operation: "add", Path: "/metadata/labels", Value: map[string]string{shard: "inst-a"}}},
		{name: "no ready instance", ring: admission, obj: obj(nil), choose: main(none), wantWhy: "the ring has no ready instance"},
		{name: "controlled object follows its controller", ring: admission, obj: obj(nil), choose: owner("inst-b", ""),
			wantPatch: &jsonpatch.JsonPatchOperation{Operation: "add", Path: "/metadata/labels", Value: map[string]string{shard: "inst-b"}}},
		{name: "controller not assigned", ring: admission, obj: obj(nil), choose: owner("", "not assigned yet"), wantWhy: "not assigned yet"},
		{name: "choice fails", ring: admission, obj: obj(nil), choose: failing, wantWhy: reasonError, wantErr: true},
		{name: "shard label set by the creator", ring: admission, obj: obj(map[string]string{shard: "inst-z"}), choose: mustNotChoose,
			wantWhy: assignReasonLabelled},
		{name: "drain label set by the creator", ring: admission, obj: obj(map[string]string{v1alpha1.DrainLabel(name): "true"}),
			choose: mustNotChoose, wantWhy: assignReasonLabelled},
		{name: "another ring's label", ring: admission, obj: obj(map[string]string{v1alpha1.ShardLabel("other"): "x"}), choose: owner("inst-a", ""),
			wantPatch: &jsonpatch.JsonPatchOperation{Operation: "add", Path: "/metadata/labels/shard.sharder.dev~1web", Value: "inst-a"}},
		{name: "watch mode", ring: watch, obj: obj(nil), choose: mustNotChoose, wantWhy: assignReasonWatchMode},
		{name: "mode unset", ring: unset, obj: obj(nil), choose: mustNotChoose, wantWhy: assignReasonWatchMode},
		{name: "unit Slots", ring: slots, obj: obj(nil), choose: owner("7", ""),
			wantPatch: &jsonpatch.JsonPatchOperation{Operation: "add", Path: "/metadata/labels", Value: map[string]string{v1alpha1.SlotLabel(name): "7"}}},
		{name: "unit Slots, controller without a slot", ring: slots, obj: obj(nil), choose: owner("", "no slot label yet"), wantWhy: "no slot label yet"},
		{name: "unit Slots, slot label set by the creator", ring: slots, obj: obj(map[string]string{v1alpha1.SlotLabel(name): "3"}),
			choose: mustNotChoose, wantWhy: assignReasonLabelled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			patch, why, err := assignment(&tc.ring, tc.obj, tc.choose)
			if (err != nil) != tc.wantErr {
				t.Fatalf("error %v, want error %v", err, tc.wantErr)
			}
			if tc.wantPatch == nil {
				if patch != nil {
					t.Fatalf("patch %+v, want none", *patch)
				}
				if why != tc.wantWhy {
					t.Errorf("reason %q, want %q", why, tc.wantWhy)
				}
				return
			}
			if patch == nil {
				t.Fatalf("no patch (%s), want %+v", why, *tc.wantPatch)
			}
			if patch.Operation != tc.wantPatch.Operation || patch.Path != tc.wantPatch.Path || !equalValue(patch.Value, tc.wantPatch.Value) {
				t.Errorf("patch %+v, want %+v", *patch, *tc.wantPatch)
			}
		})
	}
}

func equalValue(a, b any) bool {
	am, aok := a.(map[string]string)
	bm, bok := b.(map[string]string)
	if aok != bok {
		return false
	}
	if !aok {
		return a == b
	}
	if len(am) != len(bm) {
		return false
	}
	for k, v := range am {
		if bm[k] != v {
			return false
		}
	}
	return true
}

func TestBuildMutatingConfiguration(t *testing.T) {
	admission := &v1alpha1.RingAssignment{Mode: v1alpha1.AssignmentAdmission}
	rings := []v1alpha1.ControllerRing{{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: v1alpha1.ControllerRingSpec{
			Resources: []v1alpha1.RingResource{{Resource: "configmaps",
				ControlledResources: []metav1.GroupResource{{Resource: "secrets"}, {Group: "apps", Resource: "deployments"}}}},
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "web"}},
			Assignment:        admission,
		},
	}, {
		ObjectMeta: metav1.ObjectMeta{Name: "by-watch"},
		Spec:       v1alpha1.ControllerRingSpec{Resources: []v1alpha1.RingResource{{Resource: "services"}}},
	}}
	p := configParams{name: "sharder", url: "https://sharder.example:9443", caBundle: []byte("ca"), timeout: 10}
	cfg := buildMutatingConfiguration(rings, p)
	if cfg == nil || len(cfg.Webhooks) != 1 {
		t.Fatalf("want one webhook, got %+v", cfg)
	}
	w := cfg.Webhooks[0]
	if w.Name != "web.assign.sharder.dev" || *w.ClientConfig.URL != "https://sharder.example:9443/assign-shard/web" {
		t.Errorf("webhook %s calls %s", w.Name, *w.ClientConfig.URL)
	}
	if *w.FailurePolicy != admissionregistrationv1.Ignore || *w.SideEffects != admissionregistrationv1.SideEffectClassNone ||
		*w.TimeoutSeconds != MaxAssignTimeoutSeconds || *w.ReinvocationPolicy != admissionregistrationv1.NeverReinvocationPolicy {
		t.Errorf("policies: failure %s, side effects %s, timeout %d, reinvocation %s", *w.FailurePolicy, *w.SideEffects, *w.TimeoutSeconds, *w.ReinvocationPolicy)
	}
	if w.NamespaceSelector.MatchLabels["team"] != "web" {
		t.Errorf("namespace selector %v", w.NamespaceSelector)
	}
	if len(w.ObjectSelector.MatchExpressions) != 2 {
		t.Errorf("object selector %v", w.ObjectSelector)
	}
	if len(w.Rules) != 2 {
		t.Fatalf("rules %+v", w.Rules)
	}
	for _, r := range w.Rules {
		if len(r.Operations) != 1 || r.Operations[0] != admissionregistrationv1.Create {
			t.Errorf("rule %v: operations %v, want CREATE only", r.APIGroups, r.Operations)
		}
	}
	if got := w.Rules[0].Resources; len(got) != 2 || got[0] != "configmaps" || got[1] != "secrets" {
		t.Errorf("core resources %v", got)
	}
	if got := w.Rules[1].Resources; len(got) != 1 || got[0] != "deployments" {
		t.Errorf("apps resources %v", got)
	}
	// A short timeout stays as it is.
	p.timeout = 1
	if got := *buildMutatingConfiguration(rings, p).Webhooks[0].TimeoutSeconds; got != 1 {
		t.Errorf("timeout %d, want 1", got)
	}
	if cfg := buildMutatingConfiguration(rings[1:], p); cfg != nil {
		t.Errorf("no ring in admission mode: want no configuration, got %d webhooks", len(cfg.Webhooks))
	}
}
