package config

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap/zapcore"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// jitterFactor is client-go's leader election jitter: renewDeadline must
// exceed jitterFactor × retryPeriod.
const jitterFactor = 1.2

// Validate checks the whole configuration and returns every problem at once,
// each naming its field (e.g. "leaderElection.renewDeadline: Invalid value:
// ..."). It does not change cfg.
func (c *Config) Validate() error {
	var errs field.ErrorList
	if c.APIVersion != "" && c.APIVersion != APIVersion {
		errs = append(errs, field.NotSupported(field.NewPath("apiVersion"), c.APIVersion, []string{APIVersion}))
	}
	if c.Kind != "" && c.Kind != Kind {
		errs = append(errs, field.NotSupported(field.NewPath("kind"), c.Kind, []string{Kind}))
	}
	errs = append(errs, c.LeaderElection.validate(field.NewPath("leaderElection"))...)
	errs = append(errs, c.Client.validate(field.NewPath("client"))...)
	errs = append(errs, c.Controllers.Assignment.validate(field.NewPath("controllers", "assignment"))...)
	if w := c.Controllers.Leases.Workers; w < 1 || w > 1024 {
		errs = append(errs, field.Invalid(field.NewPath("controllers", "leases", "workers"), w, "must be between 1 and 1024"))
	}
	errs = append(errs, c.Webhook.validate(field.NewPath("webhook"))...)
	errs = append(errs, c.Metrics.validate(field.NewPath("metrics"))...)
	errs = append(errs, validateAddress(field.NewPath("health", "bindAddress"), c.Health.BindAddress)...)
	errs = append(errs, validateAddress(field.NewPath("pprof", "bindAddress"), c.Pprof.BindAddress)...)
	errs = append(errs, c.Logging.validate(field.NewPath("logging"))...)
	if c.ShutdownTimeout.Duration < 0 {
		errs = append(errs, field.Invalid(field.NewPath("shutdownTimeout"), c.ShutdownTimeout.Duration.String(), "must not be negative"))
	}
	errs = append(errs, c.validatePorts()...)
	return errs.ToAggregate()
}

func (l LeaderElection) validate(p *field.Path) field.ErrorList {
	if !l.Enabled {
		return nil
	}
	var errs field.ErrorList
	if l.Namespace != "" {
		for _, msg := range validation.IsDNS1123Label(l.Namespace) {
			errs = append(errs, field.Invalid(p.Child("namespace"), l.Namespace, msg))
		}
	}
	for _, msg := range validation.IsDNS1123Subdomain(l.LeaseName) {
		errs = append(errs, field.Invalid(p.Child("leaseName"), l.LeaseName, msg))
	}
	lease, renew, retry := l.LeaseDuration.Duration, l.RenewDeadline.Duration, l.RetryPeriod.Duration
	switch {
	case lease <= 0:
		errs = append(errs, field.Invalid(p.Child("leaseDuration"), lease.String(), "must be positive"))
	case renew <= 0:
		errs = append(errs, field.Invalid(p.Child("renewDeadline"), renew.String(), "must be positive"))
	case retry <= 0:
		errs = append(errs, field.Invalid(p.Child("retryPeriod"), retry.String(), "must be positive"))
	case renew >= lease:
		errs = append(errs, field.Invalid(p.Child("renewDeadline"), renew.String(),
			fmt.Sprintf("must be less than leaderElection.leaseDuration (%s), or two leaders could overlap", lease)))
	case float64(renew) <= jitterFactor*float64(retry):
		errs = append(errs, field.Invalid(p.Child("renewDeadline"), renew.String(),
			fmt.Sprintf("must be greater than %.1f × leaderElection.retryPeriod (%s)", jitterFactor, retry)))
	}
	return errs
}

func (c Client) validate(p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if c.QPS <= 0 && c.QPS != -1 {
		errs = append(errs, field.Invalid(p.Child("qps"), c.QPS, "must be positive, or -1 to turn client-side rate limiting off"))
	}
	if c.QPS > 0 && c.Burst < 1 {
		errs = append(errs, field.Invalid(p.Child("burst"), c.Burst, "must be at least 1"))
	}
	return errs
}

func (a Assignment) validate(p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if a.Workers < 1 || a.Workers > 1024 {
		errs = append(errs, field.Invalid(p.Child("workers"), a.Workers, "must be between 1 and 1024"))
	}
	if a.NamespacedWatchLimit < 0 || a.NamespacedWatchLimit > 100 {
		errs = append(errs, field.Invalid(p.Child("namespacedWatchLimit"), a.NamespacedWatchLimit,
			"must be between 0 (watch every ring across the cluster) and 100"))
	}
	if a.ResyncPeriod.Duration < time.Second {
		errs = append(errs, field.Invalid(p.Child("resyncPeriod"), a.ResyncPeriod.Duration.String(), "must be at least 1s"))
	}
	return errs
}

// validate checks what only the configuration file has (the server's port
// and certificate folder), and the rest with the webhook's rules
// (ValidateServing).
func (w Webhook) validate(p *field.Path) field.ErrorList {
	if !w.Enabled {
		return nil
	}
	var errs field.ErrorList
	if w.Port < 1 || w.Port > 65535 {
		errs = append(errs, field.Invalid(p.Child("port"), w.Port, "must be a TCP port (1-65535)"))
	}
	if w.CertDir == "" {
		errs = append(errs, field.Required(p.Child("certDir"), "the folder holding tls.crt and tls.key"))
	}
	return append(errs, w.ValidateServing(p)...)
}

// ValidateServing checks how the webhook is served and called: the
// configuration's name, the Service, the URL, the timeout and the
// certificate mode. pkg/sharder/webhook checks its options with these same
// rules, and those the file does not have (the namespaces, the leader's
// Lease, the certificate timings).
func (w Webhook) ValidateServing(p *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, msg := range validation.IsDNS1123Subdomain(w.ConfigurationName) {
		errs = append(errs, field.Invalid(p.Child("configurationName"), w.ConfigurationName, msg))
	}
	if w.ServiceNamespace != "" {
		for _, msg := range validation.IsDNS1123Label(w.ServiceNamespace) {
			errs = append(errs, field.Invalid(p.Child("serviceNamespace"), w.ServiceNamespace, msg))
		}
	}
	for _, msg := range validation.IsDNS1035Label(w.ServiceName) {
		errs = append(errs, field.Invalid(p.Child("serviceName"), w.ServiceName, msg))
	}
	if w.ServicePort < 1 || w.ServicePort > 65535 {
		errs = append(errs, field.Invalid(p.Child("servicePort"), w.ServicePort, "must be a TCP port (1-65535)"))
	}
	if w.URL != "" {
		if _, err := WebhookURLHost(w.URL); err != nil {
			errs = append(errs, field.Invalid(p.Child("url"), w.URL, err.Error()))
		}
	}
	if w.TimeoutSeconds < MinWebhookTimeoutSeconds || w.TimeoutSeconds > MaxWebhookTimeoutSeconds {
		errs = append(errs, field.Invalid(p.Child("timeoutSeconds"), w.TimeoutSeconds,
			fmt.Sprintf("must be between %d and %d", MinWebhookTimeoutSeconds, MaxWebhookTimeoutSeconds)))
	}
	switch w.CertMode {
	case CertModeSelfManaged:
		for _, msg := range validation.IsDNS1123Subdomain(w.SecretName) {
			errs = append(errs, field.Invalid(p.Child("secretName"), w.SecretName, msg))
		}
		if w.CAInjectFrom != "" {
			errs = append(errs, field.Forbidden(p.Child("caInjectFrom"), "only for certMode external: self-managed certificates carry their own CA bundle"))
		}
	case CertModeExternal:
		if w.CAInjectFrom != "" {
			if ns, name, ok := strings.Cut(w.CAInjectFrom, "/"); !ok || ns == "" || name == "" || strings.Contains(name, "/") {
				errs = append(errs, field.Invalid(p.Child("caInjectFrom"), w.CAInjectFrom, "must be <namespace>/<name> of a cert-manager Certificate"))
			}
		}
	default:
		errs = append(errs, field.NotSupported(p.Child("certMode"), w.CertMode, []string{CertModeSelfManaged, CertModeExternal}))
	}
	return errs
}

func (m Metrics) validate(p *field.Path) field.ErrorList {
	errs := validateAddress(p.Child("bindAddress"), m.BindAddress)
	if len(errs) == 0 && !m.Secure && !Disabled(m.BindAddress) && !IsLoopback(m.BindAddress) {
		errs = append(errs, field.Invalid(p.Child("secure"), false,
			fmt.Sprintf("metrics on %q would be reachable without authentication: keep secure: true, or bind to 127.0.0.1", m.BindAddress)))
	}
	return errs
}

func (l Logging) validate(p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if l.Format != LogFormatJSON && l.Format != LogFormatConsole {
		errs = append(errs, field.NotSupported(p.Child("format"), l.Format, []string{LogFormatJSON, LogFormatConsole}))
	}
	if _, err := l.ZapLevel(); err != nil {
		errs = append(errs, field.Invalid(p.Child("level"), l.Level, err.Error()))
	}
	return errs
}

// ZapLevel returns the zap level of l.Level: debug is -1, info 0, error 2,
// and a verbosity number n is -n.
func (l Logging) ZapLevel() (zapcore.Level, error) {
	switch strings.ToLower(l.Level) {
	case "debug":
		return zapcore.DebugLevel, nil
	case "info", "":
		return zapcore.InfoLevel, nil
	case "error":
		return zapcore.ErrorLevel, nil
	}
	n, err := strconv.Atoi(l.Level)
	if err != nil || n < 0 || n > 127 {
		return 0, fmt.Errorf("must be debug, info, error or a verbosity from 0 to 127")
	}
	return zapcore.Level(-n), nil
}

// Disabled reports whether a bind address turns its endpoint off ("" or "0").
func Disabled(addr string) bool { return addr == "" || addr == "0" }

// IsLoopback reports whether addr (host:port) binds only the loopback
// interface: 127.0.0.0/8, ::1 or localhost. An empty host binds everything.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func validateAddress(p *field.Path, addr string) field.ErrorList {
	if Disabled(addr) {
		return nil
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return field.ErrorList{field.Invalid(p, addr, "must be host:port (e.g. :8080 or 127.0.0.1:8080), or 0 to turn it off")}
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return field.ErrorList{field.Invalid(p, addr, "the port must be a number from 0 to 65535")}
	}
	return nil
}

// validatePorts rejects two endpoints on the same port: the second would
// fail to bind at start, after the sharder had already begun.
func (c *Config) validatePorts() field.ErrorList {
	type endpoint struct {
		path *field.Path
		port string
	}
	var endpoints []endpoint
	add := func(p *field.Path, addr string) {
		if Disabled(addr) {
			return
		}
		if _, port, err := net.SplitHostPort(addr); err == nil && port != "0" {
			endpoints = append(endpoints, endpoint{p, port})
		}
	}
	add(field.NewPath("metrics", "bindAddress"), c.Metrics.BindAddress)
	add(field.NewPath("health", "bindAddress"), c.Health.BindAddress)
	add(field.NewPath("pprof", "bindAddress"), c.Pprof.BindAddress)
	if c.Webhook.Enabled {
		add(field.NewPath("webhook", "port"), ":"+strconv.Itoa(c.Webhook.Port))
	}
	var errs field.ErrorList
	seen := map[string]*field.Path{}
	for _, e := range endpoints {
		if first, ok := seen[e.port]; ok {
			errs = append(errs, field.Duplicate(e.path, fmt.Sprintf("port %s is already used by %s", e.port, first)))
			continue
		}
		seen[e.port] = e.path
	}
	return errs
}
