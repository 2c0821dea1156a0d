package config

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
)

// APIVersion and Kind identify the configuration file format. Both are
// optional in a file; when present they must match.
const (
	APIVersion = "config.sharder.dev/v1alpha1"
	Kind       = "SharderConfiguration"
)

// Log formats.
const (
	LogFormatJSON    = "json"
	LogFormatConsole = "console"
)

// Config is the configuration of `sharder run`. The zero value is not
// useful: start from Default.
type Config struct {
	// APIVersion is config.sharder.dev/v1alpha1 (optional).
	APIVersion string `json:"apiVersion,omitempty"`
	// Kind is SharderConfiguration (optional).
	Kind string `json:"kind,omitempty"`

	// LeaderElection decides which replica runs the assignment and lease
	// controllers. Every replica serves the webhook.
	LeaderElection LeaderElection `json:"leaderElection"`
	// Client tunes the sharder's connection to the API server.
	Client Client `json:"client"`
	// Controllers tunes the leader's controllers.
	Controllers Controllers `json:"controllers"`
	// Webhook configures the label-protecting validating webhook.
	Webhook Webhook `json:"webhook"`
	// Metrics configures the Prometheus endpoint.
	Metrics Metrics `json:"metrics"`
	// Health configures the liveness and readiness endpoints.
	Health Health `json:"health"`
	// Pprof configures the Go profiling endpoint.
	Pprof Pprof `json:"pprof"`
	// Logging configures the log output.
	Logging Logging `json:"logging"`
	// ShutdownTimeout bounds how long the sharder waits for its parts to stop
	// after SIGTERM before it exits anyway. Default: 30s. Keep it below the
	// pod's terminationGracePeriodSeconds.
	ShutdownTimeout metav1.Duration `json:"shutdownTimeout"`
}

// LeaderElection configures the election among sharder replicas. Only the
// leader assigns and moves objects; a lost leadership ends the process.
type LeaderElection struct {
	// Enabled turns leader election on. Default: true. Turn it off only when
	// exactly one sharder runs (e.g. on a laptop).
	Enabled bool `json:"enabled"`
	// Namespace holds the election Lease. Default: the namespace the sharder
	// runs in (POD_NAMESPACE, else the service account's namespace); required
	// when the sharder runs outside a cluster.
	Namespace string `json:"namespace,omitempty"`
	// LeaseName is the name of the election Lease. Default: sharder.
	LeaseName string `json:"leaseName"`
	// LeaseDuration is how long a leader's Lease is valid without renewal: a
	// crashed leader is replaced after at most this long. Default: 15s.
	LeaseDuration metav1.Duration `json:"leaseDuration"`
	// RenewDeadline is how long the leader keeps retrying to renew before it
	// gives up and exits. Must be below leaseDuration. Default: 10s.
	RenewDeadline metav1.Duration `json:"renewDeadline"`
	// RetryPeriod is the wait between attempts to acquire or renew.
	// Default: 2s.
	RetryPeriod metav1.Duration `json:"retryPeriod"`
}

// Client configures the sharder's API client.
type Client struct {
	// QPS is the sustained rate of requests the sharder allows itself.
	// client-go's own default (5) would stretch a rebalance of thousands of
	// objects over minutes. The assignment workers bound the requests in
	// flight, and the API server's priority and fairness protects the
	// server. -1 turns client-side limiting off. Default: 5000.
	QPS float32 `json:"qps"`
	// Burst is the number of requests allowed above QPS for short bursts.
	// Default: 10000.
	Burst int `json:"burst"`
}

// Controllers tunes the controllers that run on the leader.
type Controllers struct {
	// Assignment tunes the assignment controller.
	Assignment Assignment `json:"assignment"`
	// Leases tunes the lease controller (instance membership and states).
	Leases Leases `json:"leases"`
}

// Leases tunes the lease controller.
type Leases struct {
	// Workers is the number of instance Leases reconciled in parallel.
	// Default: 4.
	Workers int `json:"workers"`
}

// Assignment tunes the assignment controller.
type Assignment struct {
	// Workers is the number of objects labelled or moved in parallel.
	// Default: 16.
	Workers int `json:"workers"`
	// ResyncPeriod is how often every ring is recomputed from the caches to
	// heal anything missed. It reads no objects from the API server.
	// Default: 5m.
	ResyncPeriod metav1.Duration `json:"resyncPeriod"`
	// NamespacedWatchLimit is the most namespaces a ring's resources are
	// watched in one by one: a ring whose namespaceSelector names its
	// namespaces (kubernetes.io/metadata.name with = or in), at most this
	// many, is listed and watched in those namespaces alone, so objects
	// elsewhere cost no memory and the sharder needs no permission outside
	// them. 0 watches every ring across the cluster. Default: 8.
	NamespacedWatchLimit int `json:"namespacedWatchLimit"`
}

// Webhook configures the validating webhook server that runs on every
// replica.
type Webhook struct {
	// Enabled turns the webhook on. Default: true. Without it nothing stops
	// users or other controllers from changing shard and drain labels.
	Enabled bool `json:"enabled"`
	// Port the webhook server listens on (TLS). Default: 9443.
	Port int `json:"port"`
	// CertDir holds tls.crt and tls.key (and ca.crt) of an externally
	// managed certificate, e.g. cert-manager's; it is read only in that mode.
	// The self-managed certificate lives in a Secret and is served from
	// memory. Default: /tmp/sharder/webhook-certs.
	CertDir string `json:"certDir"`
	// CertMode is self-managed (default) or external (cert-manager or a
	// mounted Secret provides the files and the CA bundle).
	CertMode string `json:"certMode"`
	// ServiceName is the Service in front of the webhook: the serving
	// certificate is issued for it. Default: sharder-webhook.
	ServiceName string `json:"serviceName"`
	// ServiceNamespace is the namespace of that Service. Default: the
	// namespace the sharder runs in.
	ServiceNamespace string `json:"serviceNamespace,omitempty"`
	// ServicePort is the port of that Service. Default: 443.
	ServicePort int `json:"servicePort"`
	// URL, when set, makes the API server call this base URL
	// (https://host[:port]) instead of the Service: for a sharder running
	// outside the cluster. Default: empty (call the Service).
	URL string `json:"url,omitempty"`
	// ConfigurationName is the ValidatingWebhookConfiguration the sharder
	// keeps. Default: sharder.
	ConfigurationName string `json:"configurationName"`
	// TimeoutSeconds is how long the API server waits for the webhook before
	// it applies the ring's failure policy (1-30). Keep it short: the
	// webhook sees only writes that change shard or drain labels, but those
	// wait on it. Default: 5.
	TimeoutSeconds int `json:"timeoutSeconds"`
	// SecretName is the Secret where the self-managed CA and certificate are
	// kept, shared by all replicas. Default: sharder-webhook-tls.
	SecretName string `json:"secretName"`
	// CAInjectFrom is, in external mode with cert-manager, the
	// "<namespace>/<name>" of the Certificate whose CA cert-manager injects
	// into the webhook configuration. Default: empty (the CA bundle is read
	// from ca.crt in certDir).
	CAInjectFrom string `json:"caInjectFrom,omitempty"`
	// OwnerClusterRole names a ClusterRole of the install (the sharder's
	// own) that becomes the owner of the webhook configuration, so that
	// removing the install (helm uninstall, kubectl delete -k) removes the
	// configuration too, through garbage collection. The sharder needs get
	// on it. Default: empty (no owner; see the uninstalling section of the
	// operations guide).
	OwnerClusterRole string `json:"ownerClusterRole,omitempty"`
}

// Metrics configures the Prometheus metrics endpoint.
type Metrics struct {
	// BindAddress is host:port; "0" turns the endpoint off. Default: :8443.
	BindAddress string `json:"bindAddress"`
	// Secure serves HTTPS and lets in only clients whose token the API
	// server authenticates and who may "get" the non-resource URL /metrics.
	// May be false only on a loopback address. Default: true.
	Secure bool `json:"secure"`
	// CertDir holds tls.crt and tls.key for the metrics endpoint. Default:
	// empty, a self-signed certificate generated at start.
	CertDir string `json:"certDir,omitempty"`
}

// Health configures the probe endpoints /healthz and /readyz.
type Health struct {
	// BindAddress is host:port; "0" turns the endpoints off. Default: :8081.
	BindAddress string `json:"bindAddress"`
}

// Pprof configures the Go profiling endpoints (/debug/pprof/).
type Pprof struct {
	// BindAddress is host:port; empty or "0" (default) turns profiling off.
	// Profiles reveal internals: bind it to 127.0.0.1 and port-forward.
	BindAddress string `json:"bindAddress,omitempty"`
}

// Logging configures the log output.
type Logging struct {
	// Format is json (default) or console.
	Format string `json:"format"`
	// Level is debug, info (default), error, or a verbosity number: 1 is
	// debug, higher numbers show more.
	Level string `json:"level"`
}

// Default returns the configuration with every default filled in. The
// values are this package's Default constants, which the components'
// options default to as well: each default is defined once, here, and the
// components depend on the configuration, not the other way round.
func Default() *Config {
	return &Config{
		APIVersion: APIVersion,
		Kind:       Kind,
		LeaderElection: LeaderElection{
			Enabled:       true,
			LeaseName:     "sharder",
			LeaseDuration: metav1.Duration{Duration: 15 * time.Second},
			RenewDeadline: metav1.Duration{Duration: 10 * time.Second},
			RetryPeriod:   metav1.Duration{Duration: 2 * time.Second},
		},
		Client: Client{QPS: DefaultQPS, Burst: DefaultBurst},
		Controllers: Controllers{
			Assignment: Assignment{
				Workers:              DefaultAssignmentWorkers,
				ResyncPeriod:         metav1.Duration{Duration: DefaultResyncPeriod},
				NamespacedWatchLimit: DefaultNamespacedWatchLimit,
			},
			Leases: Leases{Workers: DefaultLeaseWorkers},
		},
		Webhook: Webhook{
			Enabled:           true,
			Port:              ctrlwebhook.DefaultPort,
			CertDir:           "/tmp/sharder/webhook-certs",
			CertMode:          DefaultCertMode,
			ServiceName:       DefaultWebhookServiceName,
			ServicePort:       DefaultWebhookServicePort,
			ConfigurationName: DefaultWebhookConfigurationName,
			TimeoutSeconds:    DefaultWebhookTimeoutSeconds,
			SecretName:        DefaultWebhookSecretName,
		},
		Metrics:         Metrics{BindAddress: ":8443", Secure: true},
		Health:          Health{BindAddress: ":8081"},
		Logging:         Logging{Format: LogFormatJSON, Level: "info"},
		ShutdownTimeout: metav1.Duration{Duration: 30 * time.Second},
	}
}
