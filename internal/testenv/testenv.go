package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// Versions of the control plane that `make control-plane` builds. The Makefile
// and hack/tools/go.mod carry the same versions.
const (
	KubernetesVersion = "v1.36.3"
	EtcdVersion       = "v3.6.8"
)

// assetsEnv is the variable controller-runtime's envtest reads.
const assetsEnv = "KUBEBUILDER_ASSETS"

// Options configures Start. The zero value starts a bare control plane.
type Options struct {
	// CRDDirectoryPaths are folders (or files) of CRD manifests installed
	// before Start returns. Relative paths are taken from the repository
	// root. Default: none.
	CRDDirectoryPaths []string

	// Scheme is used for the client. Default: client-go's scheme plus
	// apiextensions.
	Scheme *runtime.Scheme

	// WebhookInstallOptions are passed to envtest unchanged. Default: none.
	WebhookInstallOptions envtest.WebhookInstallOptions

	// APIServerFlags and EtcdFlags are set on kube-apiserver's and etcd's
	// command lines (flag name without dashes to value), over envtest's
	// defaults, e.g. a larger etcd quota for a benchmark with many objects.
	// Default: none.
	APIServerFlags, EtcdFlags map[string]string
}

// Env is a running control plane.
type Env struct {
	// Config is an admin (system:masters) rest config with a high QPS.
	Config *rest.Config
	// Client is a controller-runtime client on Config and Scheme.
	Client client.Client
	// Scheme is the scheme Client uses.
	Scheme *runtime.Scheme
	// Environment is the underlying envtest environment.
	Environment *envtest.Environment
}

// RepoRoot returns the repository root: the nearest parent folder of the
// working directory holding the sharder go.mod.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.HasPrefix(string(data), "module github.com/sharder-dev/sharder\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("repository root not found: no parent folder holds the sharder go.mod")
		}
		dir = parent
	}
}

// AssetsDir returns the folder with etcd, kube-apiserver and kubectl:
// KUBEBUILDER_ASSETS when set, else bin/k8s/<versions> under the repository.
func AssetsDir() (string, error) {
	if dir := os.Getenv(assetsEnv); dir != "" {
		return dir, nil
	}
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(root, "bin", "k8s", KubernetesVersion+"-etcd-"+EtcdVersion)
	for _, name := range []string{"etcd", "kube-apiserver", "kubectl"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return "", fmt.Errorf("control plane binary %s not found in %s: run `make control-plane` (or `make test`), or set %s", name, dir, assetsEnv)
		}
	}
	return dir, nil
}

// DefaultScheme returns client-go's scheme (core, coordination, apps, ...).
func DefaultScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	return s
}

// Start starts etcd and kube-apiserver and installs the given CRDs.
func Start(opts Options) (*Env, error) {
	assets, err := AssetsDir()
	if err != nil {
		return nil, err
	}
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	paths := make([]string, 0, len(opts.CRDDirectoryPaths))
	for _, p := range opts.CRDDirectoryPaths {
		if !filepath.IsAbs(p) {
			p = filepath.Join(root, p)
		}
		paths = append(paths, p)
	}
	scheme := opts.Scheme
	if scheme == nil {
		scheme = DefaultScheme()
	}
	te := &envtest.Environment{
		BinaryAssetsDirectory:    assets,
		CRDDirectoryPaths:        paths,
		ErrorIfCRDPathMissing:    true,
		Scheme:                   scheme,
		WebhookInstallOptions:    opts.WebhookInstallOptions,
		ControlPlaneStartTimeout: 60 * time.Second,
		ControlPlaneStopTimeout:  30 * time.Second,
	}
	for name, value := range opts.APIServerFlags {
		te.ControlPlane.GetAPIServer().Configure().Set(name, value)
	}
	if len(opts.EtcdFlags) > 0 {
		te.ControlPlane.Etcd = &envtest.Etcd{}
		for name, value := range opts.EtcdFlags {
			te.ControlPlane.Etcd.Configure().Set(name, value)
		}
	}
	cfg, err := te.Start()
	if err != nil {
		_ = te.Stop()
		return nil, fmt.Errorf("starting control plane from %s: %w", assets, err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		_ = te.Stop()
		return nil, fmt.Errorf("creating client: %w", err)
	}
	return &Env{Config: cfg, Client: c, Scheme: scheme, Environment: te}, nil
}

// Stop stops the control plane and removes its data.
func (e *Env) Stop() error {
	if e == nil || e.Environment == nil {
		return nil
	}
	return e.Environment.Stop()
}

// Run is a TestMain helper: it runs the package's tests with s, whose
// control plane starts with opts when a test first asks for it (s.Env), and
// stops it at the end if one started. It returns the exit code for os.Exit.
func Run(m *testing.M, s *Suite, opts Options) int {
	return RunSuites(m, map[*Suite]Options{s: opts})
}

// RunSuites is Run for a package with several control planes (say, one
// with a feature gate on besides the default one): each suite's control
// plane starts with its options when a test first asks for it, and those
// that started are stopped at the end.
func RunSuites(m *testing.M, suites map[*Suite]Options) int {
	for s, opts := range suites {
		s.opts = opts
	}
	code := m.Run()
	for s := range suites {
		if s.env != nil {
			if err := s.env.Stop(); err != nil {
				fmt.Fprintf(os.Stderr, "testenv: stopping control plane: %v\n", err)
			}
		}
	}
	return code
}

// Namespace creates a namespace with a generated name for the test and
// deletes it when the test ends. Objects in it are removed with it.
func (e *Env) Namespace(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "test-"}}
	if err := e.Client.Create(ctx, ns); err != nil {
		t.Fatalf("creating test namespace: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := e.Client.Delete(ctx, ns); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting test namespace %s: %v", ns.Name, err)
		}
	})
	return ns.Name
}

// KubeConfig returns a kubeconfig file's content for the admin user.
func (e *Env) KubeConfig() []byte { return e.Environment.KubeConfig }

// WriteKubeConfig writes the admin kubeconfig to path (mode 0600).
func (e *Env) WriteKubeConfig(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return err
	}
	return os.WriteFile(path, e.KubeConfig(), 0o600)
}
