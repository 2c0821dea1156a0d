package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Defaults of the security settings, also written into the CRD schema.
const (
	// DefaultCertificateValidity is how long a certificate the operator
	// issues is valid.
	DefaultCertificateValidity = "2160h"
	// DefaultCertificateRenewBefore is how long before it expires a
	// certificate the operator issued is replaced.
	DefaultCertificateRenewBefore = "720h"
	// DefaultRootPasswordKey is the key of the root password in its Secret.
	DefaultRootPasswordKey = "password"
	// MetricsPort serves etcd's /health and /metrics over plain HTTP when
	// client TLS is on (the readiness probe needs no client certificate
	// there); clientPort and peerPort must not use it then.
	MetricsPort = 2381
)

// CertificateSource says where a cluster's certificates come from.
// +kubebuilder:validation:Enum=Operator;Secrets
type CertificateSource string

const (
	// CertificateSourceOperator: the operator keeps a CA per cluster, issues
	// the members' and its own certificates from it and renews them before
	// they expire.
	CertificateSourceOperator CertificateSource = "Operator"
	// CertificateSourceSecrets: the user provides the certificates as
	// Secrets (tls.crt, tls.key and ca.crt, as cert-manager writes them)
	// and renews them; the operator only reads them.
	CertificateSourceSecrets CertificateSource = "Secrets"
)

// EtcdSecuritySpec configures TLS and authentication.
type EtcdSecuritySpec struct {
	// TLS encrypts client and peer traffic and makes both sides present
	// certificates. It is chosen when the cluster is created: TLS cannot be
	// turned on or off, nor its source changed, afterwards (the members
	// trust one CA for their lifetime).
	// Default: no TLS.
	// +optional
	TLS *EtcdTLSSpec `json:"tls,omitempty"`

	// Auth turns on etcd's authentication with a root user whose password
	// the operator keeps in a Secret. It can be turned on for a running
	// cluster, not off.
	// Default: no authentication.
	// +optional
	Auth *EtcdAuthSpec `json:"auth,omitempty"`
}

// EtcdTLSSpec configures the members' TLS.
// +kubebuilder:validation:XValidation:rule="self.client || self.peer",message="tls must turn on client TLS, peer TLS or both"
// +kubebuilder:validation:XValidation:rule="(self.source == 'Secrets') == has(self.secrets)",message="secrets must be set exactly when source is Secrets"
// +kubebuilder:validation:XValidation:rule="!has(self.renewBefore) || !has(self.validity) || duration(self.renewBefore) < duration(self.validity)",message="renewBefore must be shorter than validity"
// +kubebuilder:validation:XValidation:rule="self.client == oldSelf.client && self.peer == oldSelf.peer && self.source == oldSelf.source && has(self.secrets) == has(oldSelf.secrets) && (!has(self.secrets) || self.secrets == oldSelf.secrets)",message="client, peer, source and secrets cannot be changed after creation"
type EtcdTLSSpec struct {
	// Client serves clients over TLS only, and only to clients presenting
	// a certificate the cluster's CA signed (client-cert-auth). The
	// readiness probe then asks /health on a plain HTTP metrics port (2381).
	// Default: true.
	// +optional
	// +kubebuilder:default=true
	Client bool `json:"client"`

	// Peer makes members talk to each other over TLS, each presenting a
	// certificate the cluster's CA signed (peer-client-cert-auth).
	// Default: true.
	// +optional
	// +kubebuilder:default=true
	Peer bool `json:"peer"`

	// Source of the certificates: Operator or Secrets.
	// Default: Operator.
	// +optional
	// +kubebuilder:default=Operator
	Source CertificateSource `json:"source,omitempty"`

	// Secrets names the user's Secrets when source is Secrets.
	// +optional
	Secrets *EtcdTLSSecrets `json:"secrets,omitempty"`

	// Validity of the certificates the operator issues (CA: ten times as
	// long).
	// Default: 2160h (90 days).
	// +optional
	// +kubebuilder:default="2160h"
	Validity *metav1.Duration `json:"validity,omitempty"`

	// RenewBefore: a certificate the operator issued is replaced this long
	// before it expires. Members load the new certificate for new
	// connections without a restart.
	// Default: 720h (30 days).
	// +optional
	// +kubebuilder:default="720h"
	RenewBefore *metav1.Duration `json:"renewBefore,omitempty"`
}

// EtcdTLSSecrets names user-provided Secrets in the namespace of the
// cluster, each with tls.crt, tls.key and ca.crt, all from one CA.
type EtcdTLSSecrets struct {
	// Server is what members serve clients and peers with. Its certificate
	// must name every member (<cluster>-<i>.<cluster>-peer.<namespace>.svc,
	// a wildcard will do) and <cluster>-client.<namespace>.svc, which the
	// operator verifies it by; its ca.crt is the CA members trust.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Server string `json:"server"`
	// Peer is the client certificate members present to each other. It
	// should carry no DNS or IP names: etcd checks those of a peer's
	// certificate against the peer's address.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Peer string `json:"peer"`
	// Client is the client certificate the operator presents.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Client string `json:"client"`
}

// EtcdAuthSpec configures etcd's authentication.
type EtcdAuthSpec struct {
	// Enabled turns authentication on: the operator creates the root user
	// with the root role and enables auth, then authenticates as root.
	// +optional
	Enabled bool `json:"enabled,omitempty"`

	// RootPasswordSecret names a Secret of the user holding the root
	// password. Default: the operator creates <cluster>-root with a random
	// password under the key "password".
	// +optional
	RootPasswordSecret *SecretKeyRef `json:"rootPasswordSecret,omitempty"`
}

// SecretKeyRef names a key of a Secret in the cluster's namespace.
type SecretKeyRef struct {
	// Name of the Secret.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// Key in the Secret.
	// Default: password.
	// +optional
	// +kubebuilder:default=password
	// +kubebuilder:validation:MaxLength=253
	Key string `json:"key,omitempty"`
}

// Condition types and reasons of TLS and authentication.
const (
	// ConditionCertificatesReady is True when the certificates the members
	// and the operator use exist and are valid; its message says until
	// when. Absent without TLS.
	ConditionCertificatesReady = "CertificatesReady"
	// ConditionAuthEnabled is True when etcd reports authentication on and
	// the operator authenticates as root. Absent without auth.
	ConditionAuthEnabled = "AuthEnabled"

	ReasonCertificatesIssued   = "Issued"
	ReasonCertificatesProvided = "Provided"
	ReasonSecretInvalid        = "SecretInvalid"
	// ReasonCAExpiring: the CA the operator made expires within
	// renewBefore; the operator does not replace a CA.
	ReasonCAExpiring  = "CAExpiring"
	ReasonAuthEnabled = "Enabled"
	ReasonAuthPending = "Pending"
	ReasonAuthFailed  = "Failed"
)
