package webhook

import (
	"fmt"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/drain"
)

// Reasons of a decision (the "reason" label of the decision metric).
const (
	reasonUnchanged       = "labels-unchanged"
	reasonSharder         = "sharder"
	reasonNotLeader       = "sharder-not-leader"
	reasonInstanceBack    = "sharder-instance-holds-lease"
	reasonAcknowledgement = "drain-acknowledgement"
	reasonAssignment      = "assignment"
	reasonShardLabel      = "shard-label-changed"
	reasonDrainLabel      = "drain-label-changed"
	reasonNotInstance     = "acknowledgement-not-instance"
	reasonOtherInstance   = "acknowledgement-other-instance"
	reasonWrongInstance   = "create-wrong-instance"
	reasonNoChoice        = "create-no-instance"
	reasonUnknownRing     = "unknown-ring"
	reasonNotSynced       = "caches-not-synced"
	reasonError           = "error"
	reasonBadRequest      = "bad-request"
)

// labelState is one label of an object: absent, or present with a value.
type labelState struct {
	present bool
	value   string
}

func labelOf(labels map[string]string, key string) labelState {
	v, ok := labels[key]
	return labelState{present: ok, value: v}
}

// labelRequest is what the decision needs to know of an admission request.
type labelRequest struct {
	ring     string
	op       admissionv1.Operation
	username string
	// fieldManager is the request's field manager (its options), which
	// names the sender among the sharder's replicas.
	fieldManager string
	// pods are the values of the request's pod-name extra
	// (serviceaccount.PodNameKey): the pod a bound ServiceAccount token was
	// issued for. None when the credential is not bound to a pod.
	pods []string
	// old is the zero value for CREATE.
	oldShard, newShard labelState
	oldDrain, newDrain labelState
}

func (r labelRequest) shardChanged() bool { return r.oldShard != r.newShard }

// handsOver reports whether the request moves the shard label from the
// object's instance to the instance its drain label names
// (drain.Target): the new value of the shard label is the old value of the
// drain label, an instance ID other than drain.NoTarget and other than the
// old instance. Whether the drain label goes in the same request is the
// caller's check.
func (r labelRequest) handsOver() bool {
	return r.oldShard.present && r.oldDrain.present && r.newShard.present &&
		r.newShard.value == r.oldDrain.value && r.newShard.value != r.oldShard.value && drain.IsTarget(r.oldDrain.value)
}

func (r labelRequest) drainChanged() bool { return r.oldDrain != r.newDrain }

// movesOff reports whether the request moves the object from the instance
// its shard label named to another one, in one write: what the sharder
// does with the objects of a gone instance, under its hold of the
// instance's Lease, and never to a ready one (those it drains).
func (r labelRequest) movesOff() bool {
	return r.op == admissionv1.Update && r.oldShard.present && r.oldShard.value != "" &&
		r.newShard.present && r.newShard.value != "" && r.newShard.value != r.oldShard.value
}

// heldByInstance decides a move of a main object off instance id by the
// sharder (labelRequest.movesOff), given the holder of the instance's Lease
// as read from the API server at admission ("" and false when the Lease is
// absent or not the ring's): denied while the instance itself holds its
// Lease. The sharder decided the move while it held the Lease; a write that
// arrives after the instance acquired it again (a sharder paused between
// its decision and its write, for however long) would pull the object from
// under a running instance without a drain.
func heldByInstance(req labelRequest, holder string, present bool) verdict {
	id := req.oldShard.value
	if !present || holder != id {
		return verdict{allowed: true, reason: reasonSharder}
	}
	return verdict{reason: reasonInstanceBack, message: fmt.Sprintf(
		"the sharder moves an object of ring %q away from instance %q without a drain only while the instance is gone, "+
			"and the instance holds its Lease again: this move was decided before it came back and must not land; "+
			"the sharder decides again", req.ring, id)}
}

// verdict is the webhook's answer.
type verdict struct {
	allowed bool
	reason  string
	// message explains a denial to the user.
	message string
}

// instancePod names the pod an instance runs in: its Lease's Pod
// ownerReference (namespace = the Lease's), else a pod named like the
// instance in any namespace (namespace ""). An error is a fault.
type instancePod func(instance string) (namespace, name string, err error)

// choice is the instance the sharder would assign a new object to. An
// empty instance with a why means there is none (e.g. no ready instance,
// or the owner is not assigned); an error is a fault.
type choice func() (instance, why string, err error)

// sharderOf is who the sharder is: its user name, and, when its writes are
// fenced by its leader election, the replica that leads.
type sharderOf struct {
	identity string
	// leader returns the leader-election identity of the replica that
	// leads, or "" and why none is known. nil: every replica's writes are
	// the sharder's.
	leader func() (string, string)
}

// admit decides a label change by the sharder's identity: allowed when it
// comes from the replica that leads (its field manager names that
// replica), or from any replica when the writes are not fenced. A replica
// that lost its leadership while frozen, or one whose webhook does not
// know the current leader, has its writes denied; the leader retries.
func (s sharderOf) admit(req labelRequest) verdict {
	if s.leader == nil {
		return verdict{allowed: true, reason: reasonSharder}
	}
	holder, why := s.leader()
	if holder == "" {
		return verdict{reason: reasonNotLeader, message: fmt.Sprintf(
			"the sharder's changes to the labels of ring %q are allowed only from the replica that leads, and no replica "+
				"leads as far as this webhook knows (%s): the leader writes them again", req.ring, why)}
	}
	if want := LeaderFieldManager(holder); req.fieldManager != want {
		return verdict{reason: reasonNotLeader, message: fmt.Sprintf(
			"the sharder's changes to the labels of ring %q are allowed only from the replica that leads, %q (field manager %q); "+
				"this request's field manager is %q: a replica that no longer leads must not move objects",
			req.ring, holder, want, req.fieldManager)}
	}
	return verdict{allowed: true, reason: reasonSharder}
}

// admit applies docs/design.md §6 to a request whose ring is known. A change to
// either label is allowed only when it comes from the sharder, when it is a
// drain acknowledgement (an UPDATE of an object that carried the drain label
// that removes it and either removes the shard label or hands the object
// over to the instance the drain label named) by one of the ring's instance
// service accounts (and, with a pod-bound credential, from the pod of the
// object's instance),
// or when it creates an object with the shard label of the instance the
// sharder would choose and no drain label. choose is called only in the
// last case, podOf only for an acknowledgement with a pod-bound credential;
// their errors are returned as is (faults).
func admit(req labelRequest, ring *v1alpha1.ControllerRing, sharder sharderOf, choose choice, podOf instancePod) (verdict, error) {
	shard, drain := v1alpha1.ShardLabel(req.ring), v1alpha1.DrainLabel(req.ring)
	switch {
	case !req.shardChanged() && !req.drainChanged():
		return verdict{allowed: true, reason: reasonUnchanged}, nil
	case sharder.identity != "" && req.username == sharder.identity:
		return sharder.admit(req), nil
	}

	if req.op == admissionv1.Update && req.oldDrain.present && !req.newDrain.present && (!req.newShard.present || req.handsOver()) {
		if !isInstance(ring, req.username) {
			return verdict{reason: reasonNotInstance, message: fmt.Sprintf(
				"removing label %q and with it removing label %q or setting it to the instance the drain label names "+
					"acknowledges a drain of ring %q, which only the ring's instances may do "+
					"(spec.instanceServiceAccounts of ControllerRing %q; the request came from %q): leave both labels as they are, "+
					"or add the instance's service account to the ring",
				drain, shard, req.ring, req.ring, req.username)}, nil
		}
		return acknowledgedBy(req, podOf)
	}

	if req.op == admissionv1.Create && req.newShard.present && !req.newDrain.present {
		want, why, err := choose()
		if err != nil {
			return verdict{}, err
		}
		switch {
		case want == "":
			return verdict{reason: reasonNoChoice, message: fmt.Sprintf(
				"label %q of ring %q is set by the sharder: %s; create the object without the label and the sharder assigns it",
				shard, req.ring, why)}, nil
		case want != req.newShard.value:
			return verdict{reason: reasonWrongInstance, message: fmt.Sprintf(
				"label %q of ring %q is set by the sharder: the object belongs to instance %q, not %q; "+
					"create it with %s=%s or without the label",
				shard, req.ring, want, req.newShard.value, shard, want)}, nil
		}
		return verdict{allowed: true, reason: reasonAssignment}, nil
	}

	if req.drainChanged() {
		return verdict{reason: reasonDrainLabel, message: fmt.Sprintf(
			"label %q of ring %q is set by the sharder only, when it moves an object between instances: "+
				"leave it as it is (an instance acknowledges a drain by removing %q and, in the same request, "+
				"setting %q to the instance the drain label names, or removing it)",
			drain, req.ring, drain, shard)}, nil
	}
	return verdict{reason: reasonShardLabel, message: fmt.Sprintf(
		"label %q of ring %q is set by the sharder only: leave it as it is; the sharder assigns every object of the ring "+
			"and moves objects when instances come and go (kubectl get controllerring %s)",
		shard, req.ring, req.ring)}, nil
}

// acknowledgedBy decides a drain acknowledgement by one of the ring's
// instance service accounts. A credential bound to a pod may acknowledge
// only the drain of an object assigned to that pod's instance; any other
// credential (a token not bound to a pod, a client certificate) keeps the
// service account rule, as does an object without a shard label, which no
// instance holds.
func acknowledgedBy(req labelRequest, podOf instancePod) (verdict, error) {
	if len(req.pods) == 0 || !req.oldShard.present {
		return verdict{allowed: true, reason: reasonAcknowledgement}, nil
	}
	instance := req.oldShard.value
	wantNS, wantPod, err := podOf(instance)
	if err != nil {
		return verdict{}, err
	}
	podNS, _, _ := serviceaccount.SplitUsername(req.username)
	if len(req.pods) == 1 && req.pods[0] == wantPod && (wantNS == "" || wantNS == podNS) {
		return verdict{allowed: true, reason: reasonAcknowledgement}, nil
	}
	want := "pod " + wantPod
	if wantNS != "" {
		want = "pod " + wantNS + "/" + wantPod + " (the owner of its Lease)"
	}
	return verdict{reason: reasonOtherInstance, message: fmt.Sprintf(
		"removing label %q (and removing %q or handing the object over) acknowledges a drain of ring %q, which only the object's instance %q may do, "+
			"running in %s; the request came from pod %s/%s: leave both labels as they are, the instance acknowledges the drain itself",
		v1alpha1.DrainLabel(req.ring), v1alpha1.ShardLabel(req.ring), req.ring, instance, want, podNS, strings.Join(req.pods, ","))}, nil
}

// isInstance reports whether username is one of the ring's instance
// service accounts.
func isInstance(ring *v1alpha1.ControllerRing, username string) bool {
	for _, sa := range ring.Spec.InstanceServiceAccounts {
		if serviceaccount.MakeUsername(sa.Namespace, sa.Name) == username {
			return true
		}
	}
	return false
}
