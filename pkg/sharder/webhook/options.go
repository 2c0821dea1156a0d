package webhook

import (
	"math"
	"net"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/clock"

	"github.com/sharder-dev/sharder/pkg/sharder/config"
	"github.com/sharder-dev/sharder/pkg/sharder/metrics"
	"github.com/sharder-dev/sharder/pkg/sharder/ringbuilds"
	"github.com/sharder-dev/sharder/pkg/sharder/webhook/internal/pki"
)

// Certificate modes (Options.CertMode): config.CertModeSelfManaged and
// config.CertModeExternal, the configuration file's.

// PathPrefix is the URL path under which the handler is served; the ring's
// name follows it.
const PathPrefix = "/validate-labels/"

// Options configures the webhook. The zero value is usable in a cluster:
// every field states its default.
type Options struct {
	// ConfigurationName is the name of the ValidatingWebhookConfiguration
	// the sharder keeps. Default: "sharder".
	ConfigurationName string

	// Namespace is the namespace the sharder runs in. Default:
	// PodNamespace(), else "sharder-system".
	Namespace string

	// ServiceName is the Service in front of the webhook servers; the API
	// server calls it and the serving certificate names it. Default:
	// "sharder-webhook".
	ServiceName string
	// ServiceNamespace is the Service's namespace. Default: Namespace.
	ServiceNamespace string
	// ServicePort is the Service's port. Default: 443.
	ServicePort int32

	// URL, when set, makes the API server call this base URL (https, host
	// and optional port; the handler's path is appended) instead of the
	// Service: for a sharder running off the cluster. Its host is added to
	// the serving certificate. Default: "" (call the Service).
	URL string

	// TimeoutSeconds is how long the API server waits for an answer before
	// it applies the ring's failure policy. Between config.MinWebhookTimeoutSeconds and
	// config.MaxWebhookTimeoutSeconds (1 and 30, the API server's bounds). Default: 5.
	TimeoutSeconds int32

	// Identity is the user name of the sharder's own requests: they skip
	// the webhook (matchConditions) and are allowed if they reach it, unless
	// LeaderLease is set.
	// Default: the user the API server authenticates the manager's
	// credentials as (a SelfSubjectReview), e.g.
	// system:serviceaccount:<namespace>:<name>.
	Identity string

	// LeaderLease names the sharder's leader-election Lease. When set, the
	// sharder's own label writes reach the webhook too (no matchCondition
	// skips them), and the webhook allows one only when its field manager
	// is LeaderFieldManager of the Lease's holder, and only while this
	// replica observed the holder's last renewal less than the Lease's
	// duration ago: a replica that was frozen past the end of its
	// leadership cannot move objects when it resumes. Every replica watches
	// the Lease. Default: zero (the sharder's identity is trusted whichever
	// replica writes, as with one replica and no leader election).
	LeaderLease types.NamespacedName

	// CertMode is config.CertModeSelfManaged or config.CertModeExternal.
	// Default: config.CertModeSelfManaged.
	CertMode string

	// SecretName is the Secret holding the self-managed CA and serving
	// certificate (ca.crt, ca.key, tls.crt, tls.key), in Namespace.
	// Default: "sharder-webhook-tls".
	SecretName string

	// CertDir is read in external mode only: when it holds ca.crt, that
	// bundle is written into the configuration. Default: "" (none).
	CertDir string
	// CAInjectFrom, in external mode, is the "<namespace>/<name>" of a
	// cert-manager Certificate: the configuration carries cert-manager's
	// inject-ca-from annotation and the sharder leaves the CA bundle to
	// cert-manager. Default: "" (no injection).
	CAInjectFrom string

	// OwnerClusterRole names a ClusterRole that the install creates and
	// removes, e.g. the sharder's own: the configuration gets an
	// ownerReference to it, so that garbage collection deletes the
	// configuration when the install is removed (helm uninstall, kubectl
	// delete -k). Left behind, it would keep sending label changes to a
	// webhook that is gone, and under failure policy Fail reject them. While
	// the ClusterRole does not exist the configuration is written without an
	// owner. Default: "" (no owner).
	OwnerClusterRole string

	// CAValidity is the lifetime of a self-managed CA. Default: 2 years.
	CAValidity time.Duration
	// CARenewBefore: a new CA is created when the current one has less than
	// this left; both are trusted until the old one expires. Must exceed
	// CertValidity + CAPropagation. Default: 180 days.
	CARenewBefore time.Duration
	// CertValidity is the lifetime of a serving certificate. Default: 90 days.
	CertValidity time.Duration
	// CertRenewBefore: the serving certificate is reissued when it has less
	// than this left. Default: 30 days.
	CertRenewBefore time.Duration
	// CAPropagation is how long a new CA is in the configuration's bundle
	// before serving certificates signed by it are used. Default: 10 minutes.
	CAPropagation time.Duration

	// ResyncPeriod is how often every replica re-reads the certificate
	// Secret (to pick up another replica's rotation) and the leader
	// re-checks the configuration. Default: 1 minute.
	ResyncPeriod time.Duration

	// Rings keeps the rings built from the memberships. `sharder run` shares
	// the assignment's, so that the leader builds each membership of a ring
	// once and derives the next ring from it. Default: the webhook's own,
	// counting its builds in sharder_ring_rebuilds_total.
	Rings *ringbuilds.Builds

	// Clock drives certificate validity and rotation. Default: the real clock.
	Clock clock.Clock
}

// Defaults of Options that the configuration file does not have; the others
// are the file's (config.DefaultWebhookConfigurationName, ...).
const (
	DefaultNamespace       = "sharder-system"
	DefaultCAValidity      = 2 * 365 * 24 * time.Hour
	DefaultCARenewBefore   = 180 * 24 * time.Hour
	DefaultCertValidity    = 90 * 24 * time.Hour
	DefaultCertRenewBefore = 30 * 24 * time.Hour
	DefaultCAPropagation   = 10 * time.Minute
	DefaultResyncPeriod    = time.Minute
)

// serviceAccountNamespaceFile holds the namespace of a pod's service account.
const serviceAccountNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// PodNamespace returns the namespace of the pod this process runs in: the
// POD_NAMESPACE environment variable (set from the downward API), else the
// namespace of the pod's service account. It returns "" off a pod.
func PodNamespace() string {
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	if b, err := os.ReadFile(serviceAccountNamespaceFile); err == nil {
		return strings.TrimSpace(string(b))
	}
	return ""
}

// setDefaults fills every unset field with its default and checks the
// result with Validate.
func (o *Options) setDefaults() error {
	if o.ConfigurationName == "" {
		o.ConfigurationName = config.DefaultWebhookConfigurationName
	}
	if o.Namespace == "" {
		o.Namespace = PodNamespace()
	}
	if o.Namespace == "" {
		o.Namespace = DefaultNamespace
	}
	if o.ServiceName == "" {
		o.ServiceName = config.DefaultWebhookServiceName
	}
	if o.ServiceNamespace == "" {
		o.ServiceNamespace = o.Namespace
	}
	if o.ServicePort == 0 {
		o.ServicePort = config.DefaultWebhookServicePort
	}
	if o.TimeoutSeconds == 0 {
		o.TimeoutSeconds = config.DefaultWebhookTimeoutSeconds
	}
	if o.CertMode == "" {
		o.CertMode = config.DefaultCertMode
	}
	if o.SecretName == "" {
		o.SecretName = config.DefaultWebhookSecretName
	}
	o.defaultTimings()
	defaultDuration(&o.ResyncPeriod, DefaultResyncPeriod)
	if o.Rings == nil {
		o.Rings = &ringbuilds.Builds{Built: metrics.CountRingRebuild}
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	return o.Validate(field.NewPath("webhook")).ToAggregate()
}

// Validate checks options whose defaults are filled in and returns every
// problem, each naming its field under path (e.g. "webhook.url"). Only
// Namespace and ServiceNamespace may still be empty (whoever sets the
// webhook up fills them in later), and zero certificate timings, which
// stand for their defaults. The configuration file of `sharder run` is
// checked with these same rules.
func (o *Options) Validate(path *field.Path) field.ErrorList {
	errs := o.served().ValidateServing(path)
	if o.Namespace != "" {
		for _, msg := range validation.IsDNS1123Label(o.Namespace) {
			errs = append(errs, field.Invalid(path.Child("namespace"), o.Namespace, msg))
		}
	}
	if (o.LeaderLease.Name == "") != (o.LeaderLease.Namespace == "") {
		errs = append(errs, field.Invalid(path.Child("leaderLease"), o.LeaderLease.String(), "needs both a namespace and a name, or neither"))
	}
	if o.CertMode == config.CertModeSelfManaged {
		timings := *o
		timings.defaultTimings()
		if err := timings.pkiConfig().Validate(); err != nil {
			errs = append(errs, field.Invalid(path, "certificate timings", err.Error()))
		}
	}
	return errs
}

// served returns the fields of o the configuration file has too, for the
// file's rules (config.Webhook.ValidateServing).
func (o *Options) served() config.Webhook {
	return config.Webhook{
		ConfigurationName: o.ConfigurationName,
		ServiceName:       o.ServiceName,
		ServiceNamespace:  o.ServiceNamespace,
		ServicePort:       int(o.ServicePort),
		URL:               o.URL,
		TimeoutSeconds:    int(o.TimeoutSeconds),
		CertMode:          o.CertMode,
		SecretName:        o.SecretName,
		CAInjectFrom:      o.CAInjectFrom,
	}
}

// FromConfig returns the webhook's options for the configuration file's
// webhook section, of a sharder running in namespace.
func FromConfig(w config.Webhook, namespace string) Options {
	return Options{
		ConfigurationName: w.ConfigurationName,
		Namespace:         namespace,
		ServiceName:       w.ServiceName,
		ServiceNamespace:  w.ServiceNamespace,
		ServicePort:       toInt32(w.ServicePort),
		URL:               w.URL,
		TimeoutSeconds:    toInt32(w.TimeoutSeconds),
		CertMode:          w.CertMode,
		SecretName:        w.SecretName,
		CertDir:           w.CertDir,
		CAInjectFrom:      w.CAInjectFrom,
		OwnerClusterRole:  w.OwnerClusterRole,
	}
}

// toInt32 converts n, saturating at the bounds of int32 so that a value out
// of range stays out of range for validation.
func toInt32(n int) int32 {
	return int32(min(max(n, math.MinInt32), math.MaxInt32))
}

// defaultTimings fills the unset certificate timings with their defaults.
func (o *Options) defaultTimings() {
	defaultDuration(&o.CAValidity, DefaultCAValidity)
	defaultDuration(&o.CARenewBefore, DefaultCARenewBefore)
	defaultDuration(&o.CertValidity, DefaultCertValidity)
	defaultDuration(&o.CertRenewBefore, DefaultCertRenewBefore)
	defaultDuration(&o.CAPropagation, DefaultCAPropagation)
}

func defaultDuration(d *time.Duration, def time.Duration) {
	if *d == 0 {
		*d = def
	}
}

// urlHost returns the host of URL without its port. The URL must be
// https://<host>[:<port>]: the handlers' paths are appended to it.
func (o Options) urlHost() (string, error) { return config.WebhookURLHost(o.URL) }

// hosts are the names the serving certificate is issued for: the Service's
// DNS names, and the URL's host when set.
func (o Options) hosts() []string {
	svc, ns := o.ServiceName, o.ServiceNamespace
	hosts := []string{svc + "." + ns + ".svc", svc + "." + ns, svc, svc + "." + ns + ".svc.cluster.local"}
	if h, err := o.urlHost(); err == nil && o.URL != "" {
		if ip := net.ParseIP(h); ip != nil {
			h = ip.String()
		}
		hosts = append(hosts, h)
	}
	return hosts
}

func (o Options) pkiConfig() pki.Config {
	return pki.Config{
		Hosts:           o.hosts(),
		CAValidity:      o.CAValidity,
		CARenewBefore:   o.CARenewBefore,
		CertValidity:    o.CertValidity,
		CertRenewBefore: o.CertRenewBefore,
		CAPropagation:   o.CAPropagation,
	}
}
