package localrun

import (
	"debug/buildinfo"
	"debug/elf"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// TestBuildPackageAsReleased checks that a run's binaries are built as the
// release builds are (Makefile, Dockerfile): static, without symbol table
// and DWARF, with trimmed paths. The bench's RSS figures count the mapped
// pages of the binary it built.
func TestBuildPackageAsReleased(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("checks an ELF binary")
	}
	path, err := BuildPackage(t.TempDir(), "./hack/pause", "pause")
	if err != nil {
		t.Fatal(err)
	}
	info, err := buildinfo.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	settings := map[string]string{}
	for _, s := range info.Settings {
		settings[s.Key] = s.Value
	}
	// -ldflags is not recorded with -trimpath: the sections below show -s -w.
	for key, want := range map[string]string{"CGO_ENABLED": "0", "-trimpath": "true"} {
		if settings[key] != want {
			t.Errorf("build setting %s = %q, want %q", key, settings[key], want)
		}
	}
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("the binary is dynamically linked (%s)", p.Type)
		}
	}
	for _, name := range []string{".symtab", ".debug_info", ".zdebug_info"} {
		if f.Section(name) != nil {
			t.Errorf("the binary has %s", name)
		}
	}
}

// TestModuleOf checks that a package is built in the module that holds it:
// the root module's in the root, the example operator's in its module.
func TestModuleOf(t *testing.T) {
	root := t.TempDir()
	for _, f := range []string{"go.mod", "cmd/sharder/main.go", "examples/etcd-operator/go.mod", "examples/etcd-operator/cmd/etcd-operator/main.go"} {
		path := filepath.Join(root, filepath.FromSlash(f))
		if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct{ pkg, dir, rel string }{
		{"./cmd/sharder", root, "./cmd/sharder"},
		{"./examples/etcd-operator/cmd/etcd-operator", filepath.Join(root, "examples", "etcd-operator"), "./cmd/etcd-operator"},
		{"./examples/etcd-operator", filepath.Join(root, "examples", "etcd-operator"), "."},
	} {
		dir, rel, err := ModuleOf(root, c.pkg)
		if err != nil || dir != c.dir || rel != c.rel {
			t.Errorf("ModuleOf(%s) = %s, %s, %v; want %s, %s", c.pkg, dir, rel, err, c.dir, c.rel)
		}
	}
	if _, _, err := ModuleOf(t.TempDir(), "./cmd/sharder"); err == nil {
		t.Error("ModuleOf found a module where none is")
	}
}
