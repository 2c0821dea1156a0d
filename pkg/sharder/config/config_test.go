package config_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"go.uber.org/zap/zapcore"

	"github.com/sharder-dev/sharder/pkg/sharder/config"
)

func TestDefaultIsValid(t *testing.T) {
	g := NewWithT(t)
	cfg := config.Default()
	g.Expect(cfg.Validate()).To(Succeed())
	g.Expect(cfg.LeaderElection.Enabled).To(BeTrue())
	g.Expect(cfg.LeaderElection.LeaseDuration.Duration).To(Equal(15 * time.Second))
	g.Expect(cfg.Client.QPS).To(BeNumerically(">=", 100), "the sharder must not be throttled by client-go's default of 5 QPS")
	g.Expect(cfg.Metrics.Secure).To(BeTrue())
	g.Expect(cfg.Pprof.BindAddress).To(BeEmpty(), "pprof is opt-in")
}

func TestLoadKeepsDefaultsOfAbsentFields(t *testing.T) {
	g := NewWithT(t)
	cfg := config.Default()
	g.Expect(config.Load([]byte(`
apiVersion: config.sharder.dev/v1alpha1
kind: SharderConfiguration
leaderElection:
  leaseDuration: 30s
  renewDeadline: 20s
client:
  qps: 50
controllers:
  assignment:
    workers: 4
logging:
  format: console
`), cfg)).To(Succeed())
	g.Expect(cfg.Validate()).To(Succeed())

	want := config.Default()
	want.LeaderElection.LeaseDuration.Duration = 30 * time.Second
	want.LeaderElection.RenewDeadline.Duration = 20 * time.Second
	want.Client.QPS = 50
	want.Controllers.Assignment.Workers = 4
	want.Logging.Format = config.LogFormatConsole
	g.Expect(cfg).To(Equal(want))
}

func TestLoadFile(t *testing.T) {
	g := NewWithT(t)
	path := filepath.Join(t.TempDir(), "config.yaml")
	g.Expect(os.WriteFile(path, []byte("webhook:\n  port: 10250\n"), 0o600)).To(Succeed())
	cfg := config.Default()
	g.Expect(config.LoadFile(path, cfg)).To(Succeed())
	g.Expect(cfg.Webhook.Port).To(Equal(10250))

	err := config.LoadFile(filepath.Join(t.TempDir(), "missing.yaml"), cfg)
	g.Expect(err).To(MatchError(ContainSubstring("reading config file")))
}

func TestLoadRejectsUnknownAndMistypedFields(t *testing.T) {
	for name, tc := range map[string]struct {
		yaml string
		want string
	}{
		"misspelt key":   {"leaderElection:\n  leaseDuraton: 30s\n", `unknown field "leaderElection.leaseDuraton"`},
		"bad duration":   {"leaderElection:\n  leaseDuration: soon\n", "soon"},
		"string as int":  {"webhook:\n  port: high\n", "port"},
		"not yaml":       {"{{", "decoding"},
		"top-level typo": {"metric:\n  secure: false\n", `unknown field "metric"`},
	} {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			err := config.Load([]byte(tc.yaml), config.Default())
			g.Expect(err).To(MatchError(ContainSubstring(tc.want)))
		})
	}
}

func TestValidateNamesTheBadField(t *testing.T) {
	for name, tc := range map[string]struct {
		edit func(*config.Config)
		want []string
	}{
		"wrong apiVersion": {func(c *config.Config) { c.APIVersion = "v1" }, []string{"apiVersion", "config.sharder.dev/v1alpha1"}},
		"wrong kind":       {func(c *config.Config) { c.Kind = "Config" }, []string{"kind", "SharderConfiguration"}},
		"renew not below lease": {func(c *config.Config) {
			c.LeaderElection.RenewDeadline.Duration = 15 * time.Second
		}, []string{"leaderElection.renewDeadline", "less than leaderElection.leaseDuration (15s)"}},
		"renew too close to retry": {func(c *config.Config) {
			c.LeaderElection.RetryPeriod.Duration = 9 * time.Second
		}, []string{"leaderElection.renewDeadline", "retryPeriod"}},
		"zero lease":          {func(c *config.Config) { c.LeaderElection.LeaseDuration.Duration = 0 }, []string{"leaderElection.leaseDuration", "positive"}},
		"bad namespace":       {func(c *config.Config) { c.LeaderElection.Namespace = "Sharder_System" }, []string{"leaderElection.namespace"}},
		"bad lease name":      {func(c *config.Config) { c.LeaderElection.LeaseName = "" }, []string{"leaderElection.leaseName"}},
		"zero qps":            {func(c *config.Config) { c.Client.QPS = 0 }, []string{"client.qps", "-1"}},
		"zero burst":          {func(c *config.Config) { c.Client.Burst = 0 }, []string{"client.burst"}},
		"no workers":          {func(c *config.Config) { c.Controllers.Assignment.Workers = 0 }, []string{"controllers.assignment.workers"}},
		"no lease workers":    {func(c *config.Config) { c.Controllers.Leases.Workers = -1 }, []string{"controllers.leases.workers"}},
		"service port":        {func(c *config.Config) { c.Webhook.ServicePort = 0 }, []string{"webhook.servicePort"}},
		"long timeout":        {func(c *config.Config) { c.Webhook.TimeoutSeconds = 31 }, []string{"webhook.timeoutSeconds", "between 1 and 30"}},
		"configuration":       {func(c *config.Config) { c.Webhook.ConfigurationName = "" }, []string{"webhook.configurationName"}},
		"http url":            {func(c *config.Config) { c.Webhook.URL = "http://10.0.0.1:9443" }, []string{"webhook.url", "https"}},
		"url with path":       {func(c *config.Config) { c.Webhook.URL = "https://10.0.0.1:9443/x" }, []string{"webhook.url"}},
		"url with user":       {func(c *config.Config) { c.Webhook.URL = "https://me@10.0.0.1:9443" }, []string{"webhook.url"}},
		"inject self-managed": {func(c *config.Config) { c.Webhook.CAInjectFrom = "ns/cert" }, []string{"webhook.caInjectFrom", "external"}},
		"inject bad ref": {func(c *config.Config) {
			c.Webhook.CertMode = config.CertModeExternal
			c.Webhook.CAInjectFrom = "cert"
		}, []string{"webhook.caInjectFrom", "<namespace>/<name>"}},
		"tiny resync": {func(c *config.Config) {
			c.Controllers.Assignment.ResyncPeriod.Duration = time.Millisecond
		}, []string{"controllers.assignment.resyncPeriod"}},
		"webhook port":     {func(c *config.Config) { c.Webhook.Port = 70000 }, []string{"webhook.port"}},
		"cert mode":        {func(c *config.Config) { c.Webhook.CertMode = "cert-manager" }, []string{"webhook.certMode", "self-managed", "external"}},
		"no cert dir":      {func(c *config.Config) { c.Webhook.CertDir = "" }, []string{"webhook.certDir"}},
		"bad service":      {func(c *config.Config) { c.Webhook.ServiceName = "Sharder.Webhook" }, []string{"webhook.serviceName"}},
		"bad secret":       {func(c *config.Config) { c.Webhook.SecretName = "" }, []string{"webhook.secretName"}},
		"metrics address":  {func(c *config.Config) { c.Metrics.BindAddress = "8443" }, []string{"metrics.bindAddress", "host:port"}},
		"insecure metrics": {func(c *config.Config) { c.Metrics.Secure = false }, []string{"metrics.secure", "without authentication"}},
		"health port":      {func(c *config.Config) { c.Health.BindAddress = ":99999" }, []string{"health.bindAddress"}},
		"same port": {func(c *config.Config) { c.Pprof.BindAddress = "127.0.0.1:8081" }, []string{
			"pprof.bindAddress", "port 8081 is already used by health.bindAddress",
		}},
		"log format":       {func(c *config.Config) { c.Logging.Format = "text" }, []string{"logging.format"}},
		"log level":        {func(c *config.Config) { c.Logging.Level = "loud" }, []string{"logging.level", "loud"}},
		"negative timeout": {func(c *config.Config) { c.ShutdownTimeout.Duration = -time.Second }, []string{"shutdownTimeout"}},
	} {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			cfg := config.Default()
			tc.edit(cfg)
			err := cfg.Validate()
			g.Expect(err).To(HaveOccurred())
			for _, want := range tc.want {
				g.Expect(err.Error()).To(ContainSubstring(want))
			}
		})
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	g := NewWithT(t)
	cfg := config.Default()
	cfg.Client.QPS = 0
	cfg.Logging.Format = "xml"
	err := cfg.Validate()
	g.Expect(err).To(HaveOccurred())
	g.Expect(strings.Count(err.Error(), ": Invalid value") + strings.Count(err.Error(), ": Unsupported value")).To(Equal(2))
}

func TestValidateAcceptsDeliberateChoices(t *testing.T) {
	for name, edit := range map[string]func(*config.Config){
		"no client rate limit":      func(c *config.Config) { c.Client.QPS = -1; c.Client.Burst = 0 },
		"insecure metrics loopback": func(c *config.Config) { c.Metrics.Secure = false; c.Metrics.BindAddress = "127.0.0.1:8080" },
		"insecure metrics localhost": func(c *config.Config) {
			c.Metrics.Secure = false
			c.Metrics.BindAddress = "localhost:8080"
		},
		"insecure metrics off":     func(c *config.Config) { c.Metrics.Secure = false; c.Metrics.BindAddress = "0" },
		"no leader election":       func(c *config.Config) { c.LeaderElection.Enabled = false; c.LeaderElection.LeaseDuration.Duration = 0 },
		"webhook off frees a port": func(c *config.Config) { c.Webhook.Enabled = false; c.Webhook.Port = 8081 },
		"external certificates":    func(c *config.Config) { c.Webhook.CertMode = config.CertModeExternal; c.Webhook.SecretName = "" },
		"cert-manager": func(c *config.Config) {
			c.Webhook.CertMode = config.CertModeExternal
			c.Webhook.CAInjectFrom = "sharder-system/sharder-webhook"
		},
		"off-cluster url": func(c *config.Config) { c.Webhook.URL = "https://192.168.1.10:9443" },
		"pprof on":        func(c *config.Config) { c.Pprof.BindAddress = "127.0.0.1:6060" },
		"verbosity":       func(c *config.Config) { c.Logging.Level = "4" },
		"random ports":    func(c *config.Config) { c.Metrics.BindAddress = ":0"; c.Health.BindAddress = "127.0.0.1:0" },
	} {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			cfg := config.Default()
			edit(cfg)
			g.Expect(cfg.Validate()).To(Succeed())
		})
	}
}

func TestZapLevel(t *testing.T) {
	for level, want := range map[string]zapcore.Level{
		"debug": zapcore.DebugLevel, "INFO": zapcore.InfoLevel, "error": zapcore.ErrorLevel,
		"0": 0, "1": -1, "5": -5,
	} {
		got, err := config.Logging{Level: level}.ZapLevel()
		if err != nil || got != want {
			t.Errorf("ZapLevel(%q) = %v, %v; want %v", level, got, err, want)
		}
	}
	for _, level := range []string{"-1", "verbose", "200"} {
		if _, err := (config.Logging{Level: level}).ZapLevel(); err == nil {
			t.Errorf("ZapLevel(%q): want an error", level)
		}
	}
}
