package app

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/wait"
)

// probeAttemptTimeout bounds one request of `sharder probe`.
const probeAttemptTimeout = 5 * time.Second

// probeOptions are the flags of `sharder probe`.
type probeOptions struct {
	caFile     string
	serverName string
	timeout    time.Duration
	interval   time.Duration
}

// NewProbeCommand returns `sharder probe`.
func NewProbeCommand() *cobra.Command {
	o := &probeOptions{timeout: time.Minute, interval: 2 * time.Second}
	cmd := &cobra.Command{
		Use:   "probe URL",
		Short: "Wait until a server answers at URL, e.g. the sharder's webhook behind its Service",
		Long: `probe requests URL until a server answers, and fails when none has answered
by --timeout. Any HTTP answer counts, whatever its status code: what is checked
is that a server is reachable at that address and, for https, that it holds a
certificate for the URL's host signed by the CA of --ca-file (the system's CAs
without it).

The Helm chart's test runs it against the webhook Service, whose endpoints are
the ready replicas only (caches synced, webhook serving): an answer means that
the API server can reach a sharder that is ready, at the name it calls.`,
		Example: `  sharder probe --ca-file /etc/sharder/webhook-ca/ca.crt https://sharder-webhook.sharder-system.svc:443/`,
		Args:    cobra.ExactArgs(1),
		PreRunE: func(_ *cobra.Command, args []string) error {
			return o.validate(args[0])
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.run(cmd.Context(), cmd.OutOrStdout(), args[0])
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.caFile, "ca-file", "", "PEM file of the CAs that may sign the server's certificate. Default: the system's CAs.")
	fs.StringVar(&o.serverName, "server-name", "", "Name the server's certificate must hold. Default: the URL's host.")
	fs.DurationVar(&o.timeout, "timeout", o.timeout, "How long to keep trying before giving up.")
	fs.DurationVar(&o.interval, "interval", o.interval, "Wait between attempts.")
	return cmd
}

func (o *probeOptions) validate(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return fmt.Errorf("URL %q: must be http(s)://<host>[:<port>][/path]", raw)
	}
	if u.Scheme == "http" && (o.caFile != "" || o.serverName != "") {
		return errors.New("--ca-file and --server-name need an https URL")
	}
	if o.timeout <= 0 || o.interval <= 0 {
		return errors.New("--timeout and --interval must be positive")
	}
	return nil
}

// client returns the HTTP client of the probe, trusting the CAs of
// --ca-file. It keeps no connection between attempts, so that each attempt
// may reach another endpoint of a Service.
func (o *probeOptions) client() (*http.Client, error) {
	tlsConfig := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: o.serverName}
	if o.caFile != "" {
		pem, err := os.ReadFile(o.caFile)
		if err != nil {
			return nil, fmt.Errorf("--ca-file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--ca-file %s: no PEM certificate in it", o.caFile)
		}
		tlsConfig.RootCAs = pool
	}
	return &http.Client{
		Timeout:   probeAttemptTimeout,
		Transport: &http.Transport{TLSClientConfig: tlsConfig, DisableKeepAlives: true, Proxy: http.ProxyFromEnvironment},
		// A redirect is an answer too.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}, nil
}

func (o *probeOptions) run(ctx context.Context, out io.Writer, target string) error {
	c, err := o.client()
	if err != nil {
		return err
	}
	var (
		status  string
		lastErr error
	)
	err = wait.PollUntilContextTimeout(ctx, o.interval, o.timeout, true, func(ctx context.Context) (bool, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
		if err != nil {
			return false, err
		}
		resp, err := c.Do(req)
		if err != nil {
			// An attempt the timeout cut short says less than the one before.
			if ctx.Err() == nil || lastErr == nil {
				lastErr = err
			}
			return false, nil
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		_ = resp.Body.Close()
		status = resp.Status
		return true, nil
	})
	if err != nil {
		if lastErr != nil {
			return fmt.Errorf("no answer from %s within %s: %w", target, o.timeout, lastErr)
		}
		return fmt.Errorf("probing %s: %w", target, err)
	}
	_, err = fmt.Fprintf(out, "%s answered: %s\n", target, status)
	return err
}
