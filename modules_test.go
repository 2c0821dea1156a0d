package sharder

import (
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The root module is the library (pkg/, cmd/sharder, internal/): a controller
// that imports pkg/instance requires it, and minimal version selection gives
// the controller's build every module it requires, at least at the versions
// it names. These are required only by the example operator and the test and
// image tooling (examples/etcd-operator, e2e/, hack/), modules of their own.
var toolingOnly = []string{
	"go.etcd.io/etcd/server/v3",
	"go.etcd.io/etcd/etcdutl/v3",
	"github.com/minio/minio-go/v7",
	"github.com/google/go-containerregistry",
	"github.com/robfig/cron/v3",
}

// pinningModules are the modules under hack/tools that pin the binaries they
// build (the control plane, promtool): no part of the workspace.
const pinningModules = "hack/tools"

// goMod is what these tests read of a go.mod.
type goMod struct {
	module   string
	requires []string          // module paths
	replaces map[string]string // module path: replacement (path and version)
}

// directive matches a go.mod line's directive, as a block's opening line
// ("require (") or a one-line directive ("require x v1").
var directive = regexp.MustCompile(`^(module|require|replace|exclude|retract|go|toolchain|godebug|tool|ignore)\b\s*(.*)$`)

// parseGoMod reads the directives these tests check from a go.mod: module,
// require and replace, in blocks or on one line, without comments.
func parseGoMod(t *testing.T, file string) goMod {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	m := goMod{replaces: map[string]string{}}
	block := ""
	for n, line := range strings.Split(string(data), "\n") {
		if i := strings.Index(line, "//"); i >= 0 {
			line = line[:i]
		}
		line = strings.TrimSpace(line)
		var verb, rest string
		switch {
		case line == "":
			continue
		case block != "" && line == ")":
			block = ""
			continue
		case block != "":
			verb, rest = block, line
		default:
			d := directive.FindStringSubmatch(line)
			if d == nil {
				t.Fatalf("%s:%d: unknown line %q", file, n+1, line)
			}
			verb, rest = d[1], strings.TrimSpace(d[2])
			if rest == "(" {
				block = verb
				continue
			}
		}
		fields := strings.Fields(strings.ReplaceAll(rest, `"`, ""))
		switch verb {
		case "module":
			m.module = fields[0]
		case "require":
			if len(fields) != 2 {
				t.Fatalf("%s:%d: require %q", file, n+1, rest)
			}
			m.requires = append(m.requires, fields[0])
		case "replace":
			old, replacement, ok := strings.Cut(rest, "=>")
			if !ok {
				t.Fatalf("%s:%d: replace %q", file, n+1, rest)
			}
			m.replaces[strings.Fields(old)[0]] = strings.TrimSpace(replacement)
		}
	}
	if m.module == "" {
		t.Fatalf("%s names no module", file)
	}
	return m
}

// TestRootModuleRequiresNoTooling checks that the root go.mod requires none
// of the modules only the tooling needs: a package of pkg/ or cmd/ that
// imported one, or a tooling package moved back into the root module, would
// bring them back with go mod tidy.
func TestRootModuleRequiresNoTooling(t *testing.T) {
	m := parseGoMod(t, "go.mod")
	if m.module != "github.com/sharder-dev/sharder" {
		t.Fatalf("go.mod is module %s", m.module)
	}
	if !slices.Contains(m.requires, "k8s.io/client-go") {
		t.Fatalf("go.mod requires no k8s.io/client-go: is it read right? %v", m.requires)
	}
	for _, mod := range m.requires {
		for _, heavy := range toolingOnly {
			if mod == heavy || strings.HasPrefix(mod, heavy+"/") {
				t.Errorf("go.mod requires %s, which only the example operator and the tooling use: "+
					"keep it out of the library's packages and their tests (their modules: go.work)", mod)
			}
		}
	}
}

// TestWorkspace checks go.work against the modules of the repository: it
// uses every go.mod's module but the pinning modules under hack/tools; the
// Makefile's MODULES are the same, for the targets that run in each; and
// every other module replaces the modules it requires of this repository
// with their folders, so that it builds alone (GOWORK=off) too.
func TestWorkspace(t *testing.T) {
	var modules []string
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (p == "bin" || p == pinningModules || strings.HasPrefix(d.Name(), ".") && p != ".") {
			return filepath.SkipDir
		}
		if d.Name() == "go.mod" {
			modules = append(modules, filepath.ToSlash(filepath.Dir(p)))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(modules)

	use := workspaceUse(t)
	if !slices.Equal(use, modules) {
		t.Errorf("go.work uses %v, the repository's modules (less %s/) are %v", use, pinningModules, modules)
	}
	makefile, err := os.ReadFile("Makefile")
	if err != nil {
		t.Fatal(err)
	}
	vars := regexp.MustCompile(`(?m)^MODULES := (.*)$`).FindSubmatch(makefile)
	if vars == nil {
		t.Fatal("the Makefile sets no MODULES")
	}
	makeModules := strings.Fields(string(vars[1]))
	slices.Sort(makeModules)
	if !slices.Equal(makeModules, modules) {
		t.Errorf("the Makefile's MODULES are %v, the repository's modules %v", makeModules, modules)
	}

	paths := map[string]string{} // module path: folder
	for _, dir := range modules {
		paths[parseGoMod(t, path.Join(dir, "go.mod")).module] = dir
	}
	for _, dir := range modules {
		m := parseGoMod(t, path.Join(dir, "go.mod"))
		if want := path.Join("github.com/sharder-dev/sharder", dir); m.module != want {
			t.Errorf("%s/go.mod is module %s, want %s", dir, m.module, want)
		}
		for _, req := range m.requires {
			target, ok := paths[req]
			if !ok {
				continue
			}
			rel, err := filepath.Rel(dir, target)
			if err != nil {
				t.Fatal(err)
			}
			if got := m.replaces[req]; got != filepath.ToSlash(rel) {
				t.Errorf("%s/go.mod replaces %s with %q, want %q", dir, req, got, filepath.ToSlash(rel))
			}
		}
	}
}

// workspaceUse returns the folders go.work uses, as relative paths, sorted.
func workspaceUse(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile("go.work")
	if err != nil {
		t.Fatal(err)
	}
	var use []string
	block := false
	for line := range strings.Lines(string(data)) {
		if i := strings.Index(line, "//"); i >= 0 {
			line = line[:i]
		}
		line = strings.TrimSpace(line)
		switch {
		case line == "use (":
			block = true
		case block && line == ")":
			block = false
		case block && line != "":
			use = append(use, path.Clean(line))
		case strings.HasPrefix(line, "use "):
			use = append(use, path.Clean(strings.TrimSpace(strings.TrimPrefix(line, "use "))))
		}
	}
	slices.Sort(use)
	return use
}

// TestWorkspaceKeepsLibraryVersions checks that the workspace builds the root
// module's packages and their tests with the module versions the root
// go.mod alone selects: make test and make images build in the workspace,
// users and the Dockerfile from the root module alone, and a tooling module
// that required a newer version of a module the library uses would raise it
// in the first builds only. Require the newer version in the root go.mod
// too, then.
func TestWorkspaceKeepsLibraryVersions(t *testing.T) {
	list := func(gowork string) []string {
		t.Helper()
		cmd := exec.Command("go", "list", "-deps", "-test", "-f", "{{with .Module}}{{if not .Main}}{{.Path}} {{.Version}}{{end}}{{end}}", "./...")
		cmd.Env = append(os.Environ(), "GOWORK="+gowork)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list (GOWORK=%s): %v", gowork, err)
		}
		mods := strings.Fields(strings.ReplaceAll(string(out), " ", "@"))
		slices.Sort(mods)
		return slices.Compact(mods)
	}
	workspace, alone := list(""), list("off")
	if len(alone) == 0 {
		t.Fatal("go list named no modules")
	}
	for _, mod := range workspace {
		if !slices.Contains(alone, mod) {
			t.Errorf("the workspace selects %s for the root module's packages; the root go.mod alone does not", mod)
		}
	}
	for _, mod := range alone {
		if !slices.Contains(workspace, mod) {
			t.Errorf("the root go.mod alone selects %s; the workspace does not", mod)
		}
	}
}
