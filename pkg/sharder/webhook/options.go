package webhook

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"k8s.io/utils/clock"

	"github.com/sharder-dev/sharder/pkg/sharder/webhook/internal/pki"
)

// Certificate modes (Options.CertMode).
const (
	// CertModeSelfManaged: the sharder keeps a CA and a serving certificate in
	// a Secret shared by all replicas, rotates them before they expire, serves
	// the current certificate without restart and writes the CA bundle into
	// the webhook configuration.
	CertModeSelfManaged = "self-managed"
	// CertModeExternal: something else (cert-manager, a mounted Secret) puts
	// tls.crt and tls.key into the webhook server's certificate folder; the
	// server watches the files. The CA bundle comes from cert-manager's CA
	// injection (Options.CAInjectFrom) or from ca.crt in Options.CertDir.
	CertModeExternal = "external"
)

// PathPrefix is the URL path under which the handler is served; the ring's
// name follows it.
const PathPrefix = "/validate-labels/"

// Options configures the webhook. The zero value is usable in a cluster:
// every field states its default.
type Options struct {
	// ConfigurationName is the name of the ValidatingWebhookConfiguration
	// the sharder keeps. Default: "sharder".
	ConfigurationName string

	// Namespace is the namespace the sharder runs in. Default: the
	// POD_NAMESPACE environment variable, else the namespace of the pod's
	// service account, else "sharder-system".
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
	// it applies the ring's failure policy. Between MinTimeoutSeconds and
	// MaxTimeoutSeconds (1 and 30, the API server's bounds). Default: 5.
	TimeoutSeconds int32

	// Identity is the user name of the sharder's own requests: they skip
	// the webhook (matchConditions) and are allowed if they reach it.
	// Default: the user the API server authenticates the manager's
	// credentials as (a SelfSubjectReview), e.g.
	// system:serviceaccount:<namespace>:<name>.
	Identity string

	// CertMode is CertModeSelfManaged or CertModeExternal. Default:
	// CertModeSelfManaged.
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

	// Clock drives certificate validity and rotation. Default: the real clock.
	Clock clock.Clock
}

// Defaults of Options.
const (
	DefaultConfigurationName = "sharder"
	DefaultNamespace         = "sharder-system"
	DefaultServiceName       = "sharder-webhook"
	DefaultServicePort       = 443
	DefaultTimeoutSeconds    = 5
	DefaultCertMode          = CertModeSelfManaged
	DefaultSecretName        = "sharder-webhook-tls" //nolint:gosec // a Secret's name, not a credential
	DefaultCAValidity        = 2 * 365 * 24 * time.Hour
	DefaultCARenewBefore     = 180 * 24 * time.Hour
	DefaultCertValidity      = 90 * 24 * time.Hour
	DefaultCertRenewBefore   = 30 * 24 * time.Hour
	DefaultCAPropagation     = 10 * time.Minute
	DefaultResyncPeriod      = time.Minute
)

// Bounds of Options.TimeoutSeconds, the API server's.
const (
	MinTimeoutSeconds = 1
	MaxTimeoutSeconds = 30
)

const serviceAccountNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// setDefaults fills every unset field with its default and checks the
// rest; an error names the field that is wrong.
func (o *Options) setDefaults() error {
	if o.ConfigurationName == "" {
		o.ConfigurationName = DefaultConfigurationName
	}
	if o.Namespace == "" {
		o.Namespace = os.Getenv("POD_NAMESPACE")
	}
	if o.Namespace == "" {
		if b, err := os.ReadFile(serviceAccountNamespaceFile); err == nil {
			o.Namespace = strings.TrimSpace(string(b))
		}
	}
	if o.Namespace == "" {
		o.Namespace = DefaultNamespace
	}
	if o.ServiceName == "" {
		o.ServiceName = DefaultServiceName
	}
	if o.ServiceNamespace == "" {
		o.ServiceNamespace = o.Namespace
	}
	if o.ServicePort == 0 {
		o.ServicePort = DefaultServicePort
	}
	if o.TimeoutSeconds == 0 {
		o.TimeoutSeconds = DefaultTimeoutSeconds
	}
	if o.CertMode == "" {
		o.CertMode = DefaultCertMode
	}
	if o.SecretName == "" {
		o.SecretName = DefaultSecretName
	}
	defaultDuration(&o.CAValidity, DefaultCAValidity)
	defaultDuration(&o.CARenewBefore, DefaultCARenewBefore)
	defaultDuration(&o.CertValidity, DefaultCertValidity)
	defaultDuration(&o.CertRenewBefore, DefaultCertRenewBefore)
	defaultDuration(&o.CAPropagation, DefaultCAPropagation)
	defaultDuration(&o.ResyncPeriod, DefaultResyncPeriod)
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}

	switch {
	case o.TimeoutSeconds < MinTimeoutSeconds || o.TimeoutSeconds > MaxTimeoutSeconds:
		return fmt.Errorf("webhook TimeoutSeconds %d: must be between %d and %d", o.TimeoutSeconds, MinTimeoutSeconds, MaxTimeoutSeconds)
	case o.ServicePort < 1 || o.ServicePort > 65535:
		return fmt.Errorf("webhook ServicePort %d: must be between 1 and 65535", o.ServicePort)
	case o.CertMode != CertModeSelfManaged && o.CertMode != CertModeExternal:
		return fmt.Errorf("webhook CertMode %q: must be %q or %q", o.CertMode, CertModeSelfManaged, CertModeExternal)
	case o.CAInjectFrom != "" && len(strings.Split(o.CAInjectFrom, "/")) != 2:
		return fmt.Errorf("webhook CAInjectFrom %q: must be <namespace>/<name>", o.CAInjectFrom)
	}
	if o.URL != "" {
		if _, err := o.urlHost(); err != nil {
			return err
		}
	}
	if o.CertMode == CertModeSelfManaged {
		if err := o.pkiConfig().Validate(); err != nil {
			return fmt.Errorf("webhook certificate timings: %w", err)
		}
	}
	return nil
}

func defaultDuration(d *time.Duration, def time.Duration) {
	if *d == 0 {
		*d = def
	}
}

// urlHost returns the host of URL without its port.
func (o Options) urlHost() (string, error) {
	u, err := url.Parse(o.URL)
	if err != nil {
		return "", fmt.Errorf("webhook URL %q: %w", o.URL, err)
	}
	if u.Scheme != "https" || u.Host == "" {
		return "", fmt.Errorf("webhook URL %q: must be https://<host>[:<port>]", o.URL)
	}
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return "", errors.New("webhook URL: must not carry a query, fragment or user")
	}
	return u.Hostname(), nil
}

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
