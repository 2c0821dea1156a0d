package v1alpha1_test

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	etcdv1alpha1 "github.com/sharder-dev/sharder/examples/etcd-operator/api/v1alpha1"
)

func withTLS(s *etcdv1alpha1.EtcdClusterSpec) {
	s.Security.TLS = &etcdv1alpha1.EtcdTLSSpec{Client: true, Peer: true}
}

func withAuth(s *etcdv1alpha1.EtcdClusterSpec) {
	s.Security.Auth = &etcdv1alpha1.EtcdAuthSpec{Enabled: true}
}

func TestSecurityDefaults(t *testing.T) {
	ctx := context.Background()
	c := newCluster(env().Namespace(t), "tls", withTLS)
	if err := env().Client.Create(ctx, c); err != nil {
		t.Fatalf("creating: %v", err)
	}
	tls := c.Spec.Security.TLS
	if tls.Source != etcdv1alpha1.CertificateSourceOperator {
		t.Errorf("source = %q; want Operator", tls.Source)
	}
	if tls.Validity == nil || tls.Validity.Duration != 2160*time.Hour || tls.RenewBefore == nil || tls.RenewBefore.Duration != 720*time.Hour {
		t.Errorf("validity, renewBefore = %v, %v; want 2160h, 720h", tls.Validity, tls.RenewBefore)
	}
}

func TestSecurityCreateValidation(t *testing.T) {
	ns := env().Namespace(t)
	tests := []struct {
		name string
		spec func(*etcdv1alpha1.EtcdClusterSpec)
		want string // "" = accepted
	}{
		{name: "tls and auth", spec: func(s *etcdv1alpha1.EtcdClusterSpec) { withTLS(s); withAuth(s) }},
		{name: "peer only", spec: func(s *etcdv1alpha1.EtcdClusterSpec) {
			s.Security.TLS = &etcdv1alpha1.EtcdTLSSpec{Peer: true}
		}},
		{name: "neither client nor peer", spec: func(s *etcdv1alpha1.EtcdClusterSpec) {
			s.Security.TLS = &etcdv1alpha1.EtcdTLSSpec{}
		}, want: "client TLS, peer TLS or both"},
		{name: "user secrets", spec: func(s *etcdv1alpha1.EtcdClusterSpec) {
			withTLS(s)
			s.Security.TLS.Source = etcdv1alpha1.CertificateSourceSecrets
			s.Security.TLS.Secrets = &etcdv1alpha1.EtcdTLSSecrets{Server: "s", Peer: "p", Client: "c"}
		}},
		{name: "source Secrets without secrets", spec: func(s *etcdv1alpha1.EtcdClusterSpec) {
			withTLS(s)
			s.Security.TLS.Source = etcdv1alpha1.CertificateSourceSecrets
		}, want: "secrets must be set exactly when source is Secrets"},
		{name: "secrets with source Operator", spec: func(s *etcdv1alpha1.EtcdClusterSpec) {
			withTLS(s)
			s.Security.TLS.Secrets = &etcdv1alpha1.EtcdTLSSecrets{Server: "s", Peer: "p", Client: "c"}
		}, want: "secrets must be set exactly when source is Secrets"},
		{name: "renewBefore beyond validity", spec: func(s *etcdv1alpha1.EtcdClusterSpec) {
			withTLS(s)
			s.Security.TLS.Validity = &metav1.Duration{Duration: time.Hour}
			s.Security.TLS.RenewBefore = &metav1.Duration{Duration: 2 * time.Hour}
		}, want: "renewBefore must be shorter than validity"},
		{name: "client port 2381 with client TLS", spec: func(s *etcdv1alpha1.EtcdClusterSpec) {
			withTLS(s)
			s.Network.ClientPort = 2381
		}, want: "must not be 2381"},
		{name: "client port 2381 without TLS", spec: func(s *etcdv1alpha1.EtcdClusterSpec) { s.Network.ClientPort = 2381 }},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := env().Client.Create(context.Background(), newCluster(ns, "s"+string(rune('a'+i)), tt.spec))
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

func TestSecurityUpdateValidation(t *testing.T) {
	ns := env().Namespace(t)
	tests := []struct {
		name           string
		create, update func(*etcdv1alpha1.EtcdClusterSpec)
		want           string // "" = accepted
	}{
		{name: "turn TLS on", update: withTLS, want: "TLS cannot be turned on or off"},
		{name: "turn TLS off", create: withTLS,
			update: func(s *etcdv1alpha1.EtcdClusterSpec) { s.Security.TLS = nil }, want: "TLS cannot be turned on or off"},
		{name: "turn client TLS off", create: withTLS,
			update: func(s *etcdv1alpha1.EtcdClusterSpec) { s.Security.TLS.Client = false }, want: "cannot be changed after creation"},
		{name: "change validity", create: withTLS,
			update: func(s *etcdv1alpha1.EtcdClusterSpec) {
				s.Security.TLS.Validity = &metav1.Duration{Duration: 48 * time.Hour}
				s.Security.TLS.RenewBefore = &metav1.Duration{Duration: 24 * time.Hour}
			}},
		{name: "turn auth on", update: withAuth},
		{name: "turn auth off", create: withAuth,
			update: func(s *etcdv1alpha1.EtcdClusterSpec) { s.Security.Auth.Enabled = false }, want: "authentication cannot be turned off"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c := newCluster(ns, "v"+string(rune('a'+i)), tt.create)
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
