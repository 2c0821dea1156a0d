package localrun

import (
	"debug/buildinfo"
	"debug/elf"
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
