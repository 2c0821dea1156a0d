package controller

import (
	"errors"
	"testing"

	etcdv1alpha1 "github.com/sharder-dev/sharder/examples/etcd-operator/api/v1alpha1"
)

// TestNextReplicas: the StatefulSet moves one member at a time and only as
// far as etcd agrees; a count changed by someone else is brought back.
func TestNextReplicas(t *testing.T) {
	listed := func(ords ...int32) map[int32]etcdMemberView {
		out := map[int32]etcdMemberView{}
		for _, o := range ords {
			out[o] = etcdMemberView{id: uint64(o) + 1}
		}
		return out
	}
	answered := etcdView{}
	silent := etcdView{err: errors.New("no answer")}
	tests := []struct {
		name         string
		size         int32
		replicas     int32
		stsExists    bool
		bootstrapped bool
		view         etcdView
		byOrdinal    map[int32]etcdMemberView
		want         int32
	}{
		{"no StatefulSet yet", 3, 0, false, false, silent, nil, 3},
		{"new cluster resized before it formed", 5, 3, true, false, silent, nil, 3},
		{"steady", 3, 3, true, true, answered, listed(0, 1, 2), 3},
		{"grow: learner not added yet", 5, 3, true, true, answered, listed(0, 1, 2), 3},
		{"grow: learner added", 5, 3, true, true, answered, listed(0, 1, 2, 3), 4},
		{"grow: last learner added", 5, 4, true, true, answered, listed(0, 1, 2, 3, 4), 5},
		{"shrink: member still listed", 3, 5, true, true, answered, listed(0, 1, 2, 3, 4), 5},
		{"shrink: member removed", 3, 5, true, true, answered, listed(0, 1, 2, 3), 4},
		{"shrink: last member removed", 3, 4, true, true, answered, listed(0, 1, 2), 3},
		{"replicas raised by someone else", 3, 7, true, true, answered, listed(0, 1, 2), 3},
		{"replicas lowered by someone else", 3, 1, true, true, answered, listed(0, 1, 2), 3},
		{"highest member being replaced", 3, 3, true, true, answered, listed(0, 1), 3},
		{"etcd silent: left alone", 3, 5, true, true, silent, nil, 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ms := &memberState{
				s:            etcdv1alpha1.EtcdClusterSpec{Size: tt.size},
				stsExists:    tt.stsExists,
				replicas:     tt.replicas,
				bootstrapped: tt.bootstrapped,
				view:         tt.view,
				byOrdinal:    tt.byOrdinal,
			}
			if got := ms.nextReplicas(); got != tt.want {
				t.Errorf("nextReplicas() = %d; want %d", got, tt.want)
			}
		})
	}
}

func TestPodOrdinal(t *testing.T) {
	c := testCluster(3)
	for name, want := range map[string]int32{"main-0": 0, "main-12": 12} {
		if got, ok := podOrdinal(c, name); !ok || got != want {
			t.Errorf("podOrdinal(%q) = %d, %v; want %d", name, got, ok, want)
		}
	}
	for _, name := range []string{"main", "main-", "main-x", "main-01", "main--1", "other-0", "main-0-1"} {
		if got, ok := podOrdinal(c, name); ok {
			t.Errorf("podOrdinal(%q) = %d; want none", name, got)
		}
	}
}

// TestJoinCluster: a joining member's initial cluster is exactly what etcd
// lists, each member under its StatefulSet name, a learner that never
// started included.
func TestJoinCluster(t *testing.T) {
	c := testCluster(3)
	s := spec(c)
	view := etcdView{members: []etcdMemberView{
		{id: 1, name: "main-0", peerURLs: []string{peerURL(c, s, 0)}},
		{id: 2, name: "main-1", peerURLs: []string{peerURL(c, s, 1)}},
		{id: 3, peerURLs: []string{peerURL(c, s, 2)}, learner: true},
		{id: 0xab, name: "outsider", peerURLs: []string{"http://elsewhere:2380"}},
	}}
	ms := &memberState{c: c, s: s, view: view, byOrdinal: map[int32]etcdMemberView{
		0: view.members[0], 1: view.members[1], 2: view.members[2],
	}}
	want := "main-0=" + peerURL(c, s, 0) + ",main-1=" + peerURL(c, s, 1) + ",main-2=" + peerURL(c, s, 2) + ",outsider=http://elsewhere:2380"
	if got := joinCluster(ms); got != want {
		t.Errorf("joinCluster() = %q; want %q", got, want)
	}
}
