package controller

import (
	etcdv1alpha1 "github.com/sharder-dev/sharder/examples/etcd-operator/api/v1alpha1"
)

// observation is what one reconcile learned about a cluster that is not
// being deleted.
type observation struct {
	// phase and reason are the phase and Ready reason the status held.
	phase  etcdv1alpha1.EtcdClusterPhase
	reason string
	// failure is the reason the cluster's objects could not be brought to
	// the spec (ReasonResourceConflict, ReasonResourceRejected), "" if they were.
	failure string
	// size is the desired number of members; ready the number the
	// StatefulSet reports ready.
	size, ready int32
	// serving: etcd answered the member list and knows a leader, and a
	// quorum of size voting members answered themselves.
	serving bool
	// complete: serving, etcd lists exactly size voting members, and every
	// one of them answered.
	complete bool
	// scaling: members are being added or removed (replicas, voting
	// members or learners differ from size); upgrading: a member pod runs
	// another version than the spec's.
	scaling, upgrading bool
}

// nextPhase is the state machine of a cluster: it returns the phase and, for
// Failed, the reason. It depends only on its input, so a reconcile that is
// repeated (or runs on another instance after a move) reaches the same answer.
func nextPhase(o observation) (etcdv1alpha1.EtcdClusterPhase, string) {
	if o.failure != "" {
		return etcdv1alpha1.EtcdClusterPhaseFailed, o.failure
	}
	// Pods being ready is not enough: etcd itself must answer.
	allReady := o.ready >= o.size && o.complete
	quorate := o.ready >= quorum(o.size) && o.serving
	switch o.phase {
	case etcdv1alpha1.EtcdClusterPhaseRunning, etcdv1alpha1.EtcdClusterPhaseScaling, etcdv1alpha1.EtcdClusterPhaseUpgrading:
		if !quorate {
			return etcdv1alpha1.EtcdClusterPhaseFailed, etcdv1alpha1.ReasonQuorumLost
		}
		return runningPhase(o), ""
	case etcdv1alpha1.EtcdClusterPhaseFailed:
		// A cluster that failed after it ran recovers as soon as a quorum
		// serves again; one that failed on its objects starts over.
		if o.reason == etcdv1alpha1.ReasonQuorumLost {
			if quorate {
				return runningPhase(o), ""
			}
			return etcdv1alpha1.EtcdClusterPhaseFailed, etcdv1alpha1.ReasonQuorumLost
		}
	}
	// "", Creating, Failed on objects, and a value written by someone else.
	if allReady {
		return etcdv1alpha1.EtcdClusterPhaseRunning, ""
	}
	return etcdv1alpha1.EtcdClusterPhaseCreating, ""
}

// runningPhase is the phase of a cluster that serves: Scaling or Upgrading
// while its members change, else Running.
func runningPhase(o observation) etcdv1alpha1.EtcdClusterPhase {
	switch {
	case o.scaling:
		return etcdv1alpha1.EtcdClusterPhaseScaling
	case o.upgrading:
		return etcdv1alpha1.EtcdClusterPhaseUpgrading
	}
	return etcdv1alpha1.EtcdClusterPhaseRunning
}
