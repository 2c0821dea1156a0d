package localrun

import (
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	sharderv1alpha1 "github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"

	"github.com/sharder-dev/sharder/internal/testenv"
)

// DefaultCRDs returns the CRD folders a run installs: the sharder's own and,
// when present, the example operator's (relative to the repository root).
func DefaultCRDs() []string {
	crds := []string{"config/crd/bases"}
	root, err := testenv.RepoRoot()
	if err != nil {
		return crds
	}
	if _, err := os.Stat(filepath.Join(root, ExampleCRDs)); err == nil {
		crds = append(crds, ExampleCRDs)
	}
	return crds
}

// ExampleCRDs is the folder of the example operator's CRDs.
const ExampleCRDs = "examples/etcd-operator/config/crd"

// ControlPlaneOptions configures StartControlPlane.
type ControlPlaneOptions struct {
	// Dir receives the kubeconfig files. Required.
	Dir string
	// CRDs are folders of CRD manifests, relative to the repository root.
	// Default: none.
	CRDs []string
	// Scheme is the scheme of the admin client. Default: client-go's scheme
	// plus the sharder's API.
	Scheme *runtime.Scheme
	// APIServerFlags and EtcdFlags are added to kube-apiserver's and etcd's
	// command lines (testenv.Options). Default: none.
	APIServerFlags, EtcdFlags map[string]string
}

// ControlPlane is a running etcd and kube-apiserver.
type ControlPlane struct {
	// Env is the underlying test environment (admin config and client).
	Env *testenv.Env
	// Client is an admin client.
	Client client.Client
	// Config is the admin rest config.
	Config *rest.Config
	// AdminKubeconfig is the path of the admin kubeconfig file.
	AdminKubeconfig string
	// Dir is where kubeconfig files are written.
	Dir string
}

// Scheme returns client-go's scheme plus the sharder's API.
func Scheme() *runtime.Scheme {
	s := testenv.DefaultScheme()
	utilruntime.Must(sharderv1alpha1.AddToScheme(s))
	return s
}

// StartControlPlane starts etcd and kube-apiserver, installs the CRDs and
// writes the admin kubeconfig into Dir.
func StartControlPlane(opts ControlPlaneOptions) (*ControlPlane, error) {
	if opts.Dir == "" {
		return nil, fmt.Errorf("control plane: Dir is required")
	}
	if opts.Scheme == nil {
		opts.Scheme = Scheme()
	}
	env, err := testenv.Start(testenv.Options{CRDDirectoryPaths: opts.CRDs, Scheme: opts.Scheme,
		APIServerFlags: opts.APIServerFlags, EtcdFlags: opts.EtcdFlags})
	if err != nil {
		return nil, err
	}
	cp := &ControlPlane{Env: env, Client: env.Client, Config: env.Config, Dir: opts.Dir,
		AdminKubeconfig: filepath.Join(opts.Dir, "admin.kubeconfig")}
	if err := env.WriteKubeConfig(cp.AdminKubeconfig); err != nil {
		_ = env.Stop()
		return nil, fmt.Errorf("writing admin kubeconfig: %w", err)
	}
	return cp, nil
}

// Stop stops the control plane and removes its data.
func (cp *ControlPlane) Stop() error {
	if cp == nil {
		return nil
	}
	return cp.Env.Stop()
}

// User is an identity with its own client certificate.
type User struct {
	// Name is the user name the API server authenticates.
	Name string
	// Kubeconfig is the path of the user's kubeconfig file.
	Kubeconfig string
	// Config is the user's rest config.
	Config *rest.Config
}

// AddUser provisions a user with the given groups and writes its kubeconfig
// into Dir as <file>.kubeconfig. Membership of system:masters grants it
// every permission under RBAC.
func (cp *ControlPlane) AddUser(file, name string, groups ...string) (*User, error) {
	u, err := cp.Env.Environment.AddUser(envtest.User{Name: name, Groups: groups}, &rest.Config{QPS: 1000, Burst: 2000})
	if err != nil {
		return nil, fmt.Errorf("adding user %s: %w", name, err)
	}
	data, err := u.KubeConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig of user %s: %w", name, err)
	}
	path := filepath.Join(cp.Dir, file+".kubeconfig")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return nil, fmt.Errorf("writing kubeconfig of user %s: %w", name, err)
	}
	return &User{Name: name, Kubeconfig: path, Config: u.Config()}, nil
}

// ServiceAccountUser is the user name of a ServiceAccount, as the API server
// reports it in admission requests.
func ServiceAccountUser(namespace, name string) string {
	return "system:serviceaccount:" + namespace + ":" + name
}

// AddServiceAccountUser provisions a user that authenticates as the
// ServiceAccount namespace/name (with its groups and system:masters), the
// identity an instance has in a cluster.
func (cp *ControlPlane) AddServiceAccountUser(file, namespace, name string) (*User, error) {
	return cp.AddUser(file, ServiceAccountUser(namespace, name),
		"system:serviceaccounts", "system:serviceaccounts:"+namespace, "system:masters")
}
