package v1alpha1_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/utils/ptr"

	etcdv1alpha1 "github.com/sharder-dev/sharder/examples/etcd-operator/api/v1alpha1"
	"github.com/sharder-dev/sharder/internal/testenv"
)

var suite testenv.Suite // the control plane, started for the first test that calls env

func env() *testenv.Env { return suite.Env() }

func TestMain(m *testing.M) {
	scheme := testenv.DefaultScheme()
	utilruntime.Must(etcdv1alpha1.AddToScheme(scheme))
	os.Exit(testenv.Run(m, &suite, testenv.Options{
		CRDDirectoryPaths: []string{"examples/etcd-operator/config/crd"},
		Scheme:            scheme,
	}))
}

func newCluster(ns, name string, mutate func(*etcdv1alpha1.EtcdClusterSpec)) *etcdv1alpha1.EtcdCluster {
	c := &etcdv1alpha1.EtcdCluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if mutate != nil {
		mutate(&c.Spec)
	}
	return c
}

// expectInvalid asserts err is an Invalid error whose message contains want.
func expectInvalid(t *testing.T, err error, want string) {
	t.Helper()
	if err == nil {
		t.Fatalf("request accepted; want rejection containing %q", want)
	}
	if !apierrors.IsInvalid(err) {
		t.Fatalf("error is not Invalid: %v", err)
	}
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not contain %q", err, want)
	}
}

func TestDefaults(t *testing.T) {
	ctx := context.Background()
	ns := env().Namespace(t)
	c := newCluster(ns, "defaults", nil)
	if err := env().Client.Create(ctx, c); err != nil {
		t.Fatalf("creating: %v", err)
	}
	s := c.Spec
	if s.Size != etcdv1alpha1.DefaultSize || s.Version != etcdv1alpha1.DefaultVersion || s.Repository != etcdv1alpha1.DefaultRepository {
		t.Errorf("size, version, repository = %d, %q, %q; want the defaults", s.Size, s.Version, s.Repository)
	}
	if s.Network.ClientPort != etcdv1alpha1.DefaultClientPort || s.Network.PeerPort != etcdv1alpha1.DefaultPeerPort || s.Network.ServiceType != "ClusterIP" {
		t.Errorf("network = %+v; want the defaults", s.Network)
	}
	if s.Storage.Size == nil || s.Storage.Size.Cmp(resource.MustParse(etcdv1alpha1.DefaultStorageSize)) != 0 {
		t.Errorf("storage size = %v; want %s", s.Storage.Size, etcdv1alpha1.DefaultStorageSize)
	}
}

func TestCreateValidation(t *testing.T) {
	ns := env().Namespace(t)
	tests := []struct {
		name   string
		object string
		spec   func(*etcdv1alpha1.EtcdClusterSpec)
		want   string // "" = accepted
	}{
		{name: "size 1", spec: func(s *etcdv1alpha1.EtcdClusterSpec) { s.Size = 1 }},
		{name: "size 9", spec: func(s *etcdv1alpha1.EtcdClusterSpec) { s.Size = 9 }},
		{name: "size even", spec: func(s *etcdv1alpha1.EtcdClusterSpec) { s.Size = 4 }, want: "size must be odd"},
		{name: "size above 9", spec: func(s *etcdv1alpha1.EtcdClusterSpec) { s.Size = 11 }, want: "should be less than or equal to 9"},
		{name: "size negative", spec: func(s *etcdv1alpha1.EtcdClusterSpec) { s.Size = -1 }, want: "should be greater than or equal to 1"},
		{name: "version 3.5.21", spec: func(s *etcdv1alpha1.EtcdClusterSpec) { s.Version = "3.5.21" }},
		{name: "version with v", spec: func(s *etcdv1alpha1.EtcdClusterSpec) { s.Version = "v3.5.0" }, want: "spec.version"},
		{name: "version 2.x", spec: func(s *etcdv1alpha1.EtcdClusterSpec) { s.Version = "2.3.8" }, want: "spec.version"},
		{name: "version suffix", spec: func(s *etcdv1alpha1.EtcdClusterSpec) { s.Version = "3.5.0-rc.1" }, want: "spec.version"},
		{name: "repository too long", spec: func(s *etcdv1alpha1.EtcdClusterSpec) { s.Repository = strings.Repeat("r", 254) }, want: "spec.repository"},
		{name: "same ports", spec: func(s *etcdv1alpha1.EtcdClusterSpec) { s.Network.ClientPort = 2380 }, want: "clientPort and peerPort must differ"},
		{name: "managed etcd flag", spec: func(s *etcdv1alpha1.EtcdClusterSpec) {
			s.Advanced.EtcdConfig = map[string]string{"initial-cluster": "x=http://x:2380"}
		}, want: "cannot set flags the operator manages"},
		{name: "etcd flag with dashes", spec: func(s *etcdv1alpha1.EtcdClusterSpec) {
			s.Advanced.EtcdConfig = map[string]string{"--heartbeat-interval": "200"}
		}, want: "etcdConfig keys"},
		{name: "etcd flag", spec: func(s *etcdv1alpha1.EtcdClusterSpec) {
			s.Advanced.EtcdConfig = map[string]string{"heartbeat-interval": "200"}
		}},
		{name: "name starting with a digit", object: "1abc", want: "the name must start with a letter"},
		{name: "name too long", object: "a" + strings.Repeat("b", 52), want: "at most 52"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			name := tt.object
			if name == "" {
				name = "c" + string(rune('a'+i))
			}
			err := env().Client.Create(context.Background(), newCluster(ns, name, tt.spec))
			if tt.want == "" {
				if err != nil {
					t.Fatalf("rejected: %v", err)
				}
				return
			}
			expectInvalid(t, err, tt.want)
		})
	}
}

func TestUpdateValidation(t *testing.T) {
	ns := env().Namespace(t)
	tests := []struct {
		name   string
		create func(*etcdv1alpha1.EtcdClusterSpec)
		update func(*etcdv1alpha1.EtcdClusterSpec)
		want   string // "" = accepted
	}{
		{name: "upgrade patch", create: func(s *etcdv1alpha1.EtcdClusterSpec) { s.Version = "3.5.9" },
			update: func(s *etcdv1alpha1.EtcdClusterSpec) { s.Version = "3.5.10" }},
		{name: "upgrade minor", create: func(s *etcdv1alpha1.EtcdClusterSpec) { s.Version = "3.5.21" },
			update: func(s *etcdv1alpha1.EtcdClusterSpec) { s.Version = "3.6.0" }},
		{name: "skip a minor", create: func(s *etcdv1alpha1.EtcdClusterSpec) { s.Version = "3.4.30" },
			update: func(s *etcdv1alpha1.EtcdClusterSpec) { s.Version = "3.6.8" }, want: "one minor release at a time"},
		{name: "downgrade patch", create: func(s *etcdv1alpha1.EtcdClusterSpec) { s.Version = "3.5.10" },
			update: func(s *etcdv1alpha1.EtcdClusterSpec) { s.Version = "3.5.9" }, want: "version cannot be downgraded"},
		{name: "downgrade minor", create: func(s *etcdv1alpha1.EtcdClusterSpec) { s.Version = "3.6.0" },
			update: func(s *etcdv1alpha1.EtcdClusterSpec) { s.Version = "3.5.21" }, want: "version cannot be downgraded"},
		{name: "grow 3 to 5", create: func(s *etcdv1alpha1.EtcdClusterSpec) { s.Size = 3 },
			update: func(s *etcdv1alpha1.EtcdClusterSpec) { s.Size = 5 }},
		{name: "shrink 5 to 3", create: func(s *etcdv1alpha1.EtcdClusterSpec) { s.Size = 5 },
			update: func(s *etcdv1alpha1.EtcdClusterSpec) { s.Size = 3 }},
		{name: "shrink 3 to 1", create: func(s *etcdv1alpha1.EtcdClusterSpec) { s.Size = 3 },
			update: func(s *etcdv1alpha1.EtcdClusterSpec) { s.Size = 1 }, want: "cannot be shrunk below 3"},
		{name: "shrink 5 to 1", create: func(s *etcdv1alpha1.EtcdClusterSpec) { s.Size = 5 },
			update: func(s *etcdv1alpha1.EtcdClusterSpec) { s.Size = 1 }, want: "cannot be shrunk below 3"},
		{name: "grow 1 to 3", create: func(s *etcdv1alpha1.EtcdClusterSpec) { s.Size = 1 },
			update: func(s *etcdv1alpha1.EtcdClusterSpec) { s.Size = 3 }},
		{name: "resize to even", create: func(s *etcdv1alpha1.EtcdClusterSpec) { s.Size = 3 },
			update: func(s *etcdv1alpha1.EtcdClusterSpec) { s.Size = 4 }, want: "size must be odd"},
		{name: "storage change", create: nil,
			update: func(s *etcdv1alpha1.EtcdClusterSpec) { s.Storage.Size = ptr.To(resource.MustParse("20Gi")) }, want: "storage cannot be changed"},
		{name: "peer port change", create: nil,
			update: func(s *etcdv1alpha1.EtcdClusterSpec) { s.Network.PeerPort = 2390 }, want: "peerPort cannot be changed"},
		{name: "client port change", create: nil,
			update: func(s *etcdv1alpha1.EtcdClusterSpec) { s.Network.ClientPort = 2389 }},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c := newCluster(ns, "u"+string(rune('a'+i)), tt.create)
			if err := env().Client.Create(ctx, c); err != nil {
				t.Fatalf("creating: %v", err)
			}
			tt.update(&c.Spec)
			err := env().Client.Update(ctx, c)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("update rejected: %v", err)
				}
				return
			}
			expectInvalid(t, err, tt.want)
		})
	}
}
