package ring_test

import (
	"testing"

	"github.com/sharder-dev/sharder/pkg/ring"
)

func TestObjectKey(t *testing.T) {
	for _, tc := range []struct {
		group, kind, namespace, name, want string
	}{
		{"etcd.example.dev", "EtcdCluster", "prod", "main", "etcd.example.dev/EtcdCluster/prod/main"},
		{"", "ConfigMap", "default", "settings", "/ConfigMap/default/settings"},
		{"example.dev", "Widget", "", "cluster-wide", "example.dev/Widget//cluster-wide"},
	} {
		if got := ring.ObjectKey(tc.group, tc.kind, tc.namespace, tc.name); got != tc.want {
			t.Errorf("ObjectKey(%q, %q, %q, %q) = %q, want %q", tc.group, tc.kind, tc.namespace, tc.name, got, tc.want)
		}
	}
}
