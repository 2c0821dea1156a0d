package localrun

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/sharder-dev/sharder/internal/testenv"
)

// Packages of the binaries a run builds.
const (
	SharderPackage  = "./cmd/sharder"
	OperatorPackage = "./examples/etcd-operator/cmd/etcd-operator"
	// PlainControllerPackage is a controller that knows nothing of sharder
	// beyond a label selector, run beside `sharder agent`.
	PlainControllerPackage = "./e2e/plaincontroller"
)

// Binaries are the built programs of a run.
type Binaries struct {
	// Sharder is the path of the sharder binary.
	Sharder string
	// Operator is the path of the example operator binary.
	Operator string
	// PlainController is the path of the plain controller binary.
	PlainController string
}

// BuildOptions configures Build.
type BuildOptions struct {
	// Dir receives the binaries. Required.
	Dir string
	// Operator builds the example operator as well. Default: false.
	Operator bool
	// PlainController builds the plain controller as well. Default: false.
	PlainController bool
}

// Build compiles the sharder (and the other programs when asked) from the
// repository into Dir. Each binary is built once; callers share the result.
func Build(opts BuildOptions) (Binaries, error) {
	var b Binaries
	var err error
	if b.Sharder, err = BuildPackage(opts.Dir, SharderPackage, "sharder"); err != nil {
		return b, err
	}
	if opts.Operator {
		if b.Operator, err = BuildPackage(opts.Dir, OperatorPackage, "etcd-operator"); err != nil {
			return b, err
		}
	}
	if opts.PlainController {
		if b.PlainController, err = BuildPackage(opts.Dir, PlainControllerPackage, "plaincontroller"); err != nil {
			return b, err
		}
	}
	return b, nil
}

// buildFlags are the flags of the release builds (the Makefile's images
// and dist targets, the Dockerfile): a static binary (no cgo), without
// symbol table and DWARF (-s -w), with module paths instead of this
// machine's in its tables (-trimpath). Runs build the binaries users run:
// a cgo build links libc and a bigger file, whose mapped pages the bench's
// RSS figures would count.
var buildFlags = []string{"-trimpath", "-ldflags=-s -w"}

// BuildPackage runs `go build` for pkg (relative to the repository root)
// as the release builds do (buildFlags, CGO_ENABLED=0) and returns the
// path of the binary name in dir.
func BuildPackage(dir, pkg, name string) (string, error) {
	root, err := testenv.RepoRoot()
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return "", err
	}
	out := filepath.Join(dir, name)
	// In the package's own module, where it builds with or without the
	// workspace (go.work).
	modDir, rel, err := ModuleOf(root, pkg)
	if err != nil {
		return "", err
	}
	args := append(append([]string{"build"}, buildFlags...), "-o", out, rel)
	cmd := exec.CommandContext(context.Background(), "go", args...) //nolint:gosec // builds a package of this repository
	cmd.Dir = modDir
	cmd.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false", "CGO_ENABLED=0")
	var output bytes.Buffer
	cmd.Stdout, cmd.Stderr = &output, &output
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("building %s: %w\n%s", pkg, err, output.String())
	}
	return out, nil
}

// ModuleOf returns the folder of the module that holds pkg (a path relative
// to the repository root, as ./examples/etcd-operator/cmd/etcd-operator) in
// the repository at root, and pkg relative to that folder: the nearest
// folder at or above the package's with a go.mod. The example operator, the
// end-to-end suites and hack/ are modules of their own (go.work); in
// revisions before they were, every package is in the root module.
func ModuleOf(root, pkg string) (dir, rel string, err error) {
	pkgDir := filepath.Join(root, filepath.FromSlash(pkg))
	for dir = pkgDir; ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		if dir == filepath.Clean(root) || filepath.Dir(dir) == dir {
			return "", "", fmt.Errorf("no go.mod at or above %s", pkgDir)
		}
	}
	rel, err = filepath.Rel(dir, pkgDir)
	if err != nil {
		return "", "", err
	}
	if rel == "." {
		return dir, ".", nil
	}
	return dir, "./" + filepath.ToSlash(rel), nil
}
