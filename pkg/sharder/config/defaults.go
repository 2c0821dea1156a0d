package config

import (
	"errors"
	"net/url"
	"time"
)

// Webhook certificate modes (webhook.certMode).
const (
	// CertModeSelfManaged: the sharder keeps a CA and a serving certificate
	// in a Secret shared by all replicas, rotates them before they expire,
	// serves the current certificate without restart and writes the CA
	// bundle into the webhook configuration. Nothing else to install.
	CertModeSelfManaged = "self-managed"
	// CertModeExternal: something else (cert-manager, a mounted Secret)
	// writes tls.crt and tls.key into webhook.certDir, which the server
	// watches; the CA bundle comes from cert-manager's CA injection
	// (webhook.caInjectFrom) or from ca.crt in webhook.certDir.
	CertModeExternal = "external"
)

// Defaults of the configuration file. The components' options default to
// the same constants (pkg/sharder/assign, leasecontroller, webhook), so that
// a setting has one default whether it comes from the file or from code.
const (
	// DefaultQPS and DefaultBurst are the sharder's client-side rate limit
	// (client.qps, client.burst).
	DefaultQPS   = 5000
	DefaultBurst = 10000
	// DefaultAssignmentWorkers is controllers.assignment.workers.
	DefaultAssignmentWorkers = 16
	// DefaultResyncPeriod is controllers.assignment.resyncPeriod.
	DefaultResyncPeriod = 5 * time.Minute
	// DefaultNamespacedWatchLimit is
	// controllers.assignment.namespacedWatchLimit.
	DefaultNamespacedWatchLimit = 8
	// DefaultLeaseWorkers is controllers.leases.workers.
	DefaultLeaseWorkers = 4

	// DefaultCertMode is webhook.certMode.
	DefaultCertMode = CertModeSelfManaged
	// DefaultWebhookConfigurationName is webhook.configurationName.
	DefaultWebhookConfigurationName = "sharder"
	// DefaultWebhookServiceName and DefaultWebhookServicePort are
	// webhook.serviceName and webhook.servicePort.
	DefaultWebhookServiceName = "sharder-webhook"
	DefaultWebhookServicePort = 443
	// DefaultWebhookTimeoutSeconds is webhook.timeoutSeconds.
	DefaultWebhookTimeoutSeconds = 5
	// DefaultWebhookSecretName is webhook.secretName.
	DefaultWebhookSecretName = "sharder-webhook-tls" //nolint:gosec // a Secret's name, not a credential
)

// Bounds of webhook.timeoutSeconds, the API server's.
const (
	MinWebhookTimeoutSeconds = 1
	MaxWebhookTimeoutSeconds = 30
)

// WebhookURLHost returns the host of a webhook base URL without its port.
// The URL must be https://<host>[:<port>]: the handlers' paths are appended
// to it.
func WebhookURLHost(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", err
	}
	if u.Scheme != "https" || u.Host == "" || (u.Path != "" && u.Path != "/") {
		return "", errors.New("must be https://<host>[:<port>], without path or query")
	}
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return "", errors.New("must not carry a query, fragment or user")
	}
	return u.Hostname(), nil
}
