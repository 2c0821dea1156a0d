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
	args := append(append([]string{"build"}, buildFlags...), "-o", out, pkg)
	cmd := exec.CommandContext(context.Background(), "go", args...) //nolint:gosec // builds a package of this repository
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false", "CGO_ENABLED=0")
	var output bytes.Buffer
	cmd.Stdout, cmd.Stderr = &output, &output
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("building %s: %w\n%s", pkg, err, output.String())
	}
	return out, nil
}
