package controller

import (
	"testing"

	etcdv1alpha1 "github.com/sharder-dev/sharder/examples/etcd-operator/api/v1alpha1"
)

func TestNextPhase(t *testing.T) {
	const (
		creating  = etcdv1alpha1.EtcdClusterPhaseCreating
		running   = etcdv1alpha1.EtcdClusterPhaseRunning
		failed    = etcdv1alpha1.EtcdClusterPhaseFailed
		scaling   = etcdv1alpha1.EtcdClusterPhaseScaling
		upgrading = etcdv1alpha1.EtcdClusterPhaseUpgrading
		conflict  = etcdv1alpha1.ReasonResourceConflict
		lost      = etcdv1alpha1.ReasonQuorumLost
	)
	tests := []struct {
		name       string
		in         observation
		wantPhase  etcdv1alpha1.EtcdClusterPhase
		wantReason string
	}{
		{"new cluster", observation{phase: "", size: 3, ready: 0}, creating, ""},
		{"new cluster already ready", observation{phase: "", size: 1, ready: 1, serving: true, complete: true}, running, ""},
		{"pods ready, etcd not answering", observation{phase: "", size: 3, ready: 3}, creating, ""},
		{"pods ready, etcd serving without every member", observation{phase: creating, size: 3, ready: 3, serving: true}, creating, ""},
		{"creating with quorum only", observation{phase: creating, size: 3, ready: 2, serving: true, complete: true}, creating, ""},
		{"creating all ready", observation{phase: creating, size: 3, ready: 3, serving: true, complete: true}, running, ""},
		{"creating object conflict", observation{phase: creating, size: 3, ready: 3, failure: conflict}, failed, conflict},
		{"running degraded", observation{phase: running, size: 5, ready: 3, serving: true}, running, ""},
		{"running loses quorum", observation{phase: running, size: 5, ready: 2}, failed, lost},
		{"running, etcd stops answering", observation{phase: running, size: 3, ready: 3}, failed, lost},
		{"running single member down", observation{phase: running, size: 1, ready: 0}, failed, lost},
		{"running object rejected", observation{phase: running, size: 3, ready: 3, failure: etcdv1alpha1.ReasonResourceRejected},
			failed, etcdv1alpha1.ReasonResourceRejected},
		{"quorum still lost", observation{phase: failed, reason: lost, size: 3, ready: 1}, failed, lost},
		{"quorum regained", observation{phase: failed, reason: lost, size: 3, ready: 2, serving: true}, running, ""},
		{"conflict resolved, members starting", observation{phase: failed, reason: conflict, size: 3, ready: 0}, creating, ""},
		{"pods back, etcd not yet", observation{phase: failed, reason: lost, size: 3, ready: 3}, failed, lost},
		{"conflict resolved, members ready", observation{phase: failed, reason: conflict, size: 3, ready: 3, serving: true, complete: true}, running, ""},
		{"conflict persists", observation{phase: failed, reason: conflict, size: 3, ready: 3, failure: conflict}, failed, conflict},
		{"grown spec while running", observation{phase: running, size: 5, ready: 3, serving: true, scaling: true}, scaling, ""},
		{"scaling done", observation{phase: scaling, size: 5, ready: 5, serving: true, complete: true}, running, ""},
		{"scaling loses quorum", observation{phase: scaling, size: 3, ready: 1, scaling: true}, failed, lost},
		{"new version while running", observation{phase: running, size: 3, ready: 3, serving: true, complete: true, upgrading: true}, upgrading, ""},
		{"upgrading, a member restarting", observation{phase: upgrading, size: 3, ready: 2, serving: true, upgrading: true}, upgrading, ""},
		{"upgrade done", observation{phase: upgrading, size: 3, ready: 3, serving: true, complete: true}, running, ""},
		{"quorum regained while scaling", observation{phase: failed, reason: lost, size: 3, ready: 2, serving: true, scaling: true}, scaling, ""},
		{"creating is not scaling", observation{phase: creating, size: 3, ready: 1, serving: true, scaling: true}, creating, ""},
		{"unknown phase", observation{phase: "Resizing", size: 3, ready: 1}, creating, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			phase, reason := nextPhase(tt.in)
			if phase != tt.wantPhase || reason != tt.wantReason {
				t.Errorf("nextPhase(%+v) = %s, %q; want %s, %q", tt.in, phase, reason, tt.wantPhase, tt.wantReason)
			}
		})
	}
}

func TestQuorum(t *testing.T) {
	for size, want := range map[int32]int32{1: 1, 3: 2, 5: 3, 7: 4, 9: 5} {
		if got := quorum(size); got != want {
			t.Errorf("quorum(%d) = %d; want %d", size, got, want)
		}
	}
}
