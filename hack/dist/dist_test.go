package main

import (
	"archive/tar"
	"archive/zip"
	"bufio"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	"sigs.k8s.io/yaml"
)

// krewPlugin is the part of a krew manifest the tests read.
type krewPlugin struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Version          string `json:"version"`
		Homepage         string `json:"homepage"`
		ShortDescription string `json:"shortDescription"`
		Description      string `json:"description"`
		Platforms        []struct {
			Selector struct {
				MatchLabels map[string]string `json:"matchLabels"`
			} `json:"selector"`
			URI    string `json:"uri"`
			SHA256 string `json:"sha256"`
			Bin    string `json:"bin"`
			Files  []struct {
				From string `json:"from"`
				To   string `json:"to"`
			} `json:"files"`
		} `json:"platforms"`
	} `json:"spec"`
}

// readArchive returns the files of a tar.gz or zip archive by name, with
// their modes.
func readArchive(t *testing.T, path string) (map[string][]byte, map[string]os.FileMode) {
	t.Helper()
	files, modes := map[string][]byte{}, map[string]os.FileMode{}
	if strings.HasSuffix(path, ".zip") {
		zr, err := zip.OpenReader(path)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = zr.Close() }()
		for _, f := range zr.File {
			rc, err := f.Open()
			if err != nil {
				t.Fatal(err)
			}
			data, err := io.ReadAll(rc)
			_ = rc.Close()
			if err != nil {
				t.Fatal(err)
			}
			files[f.Name], modes[f.Name] = data, f.Mode().Perm()
		}
		return files, modes
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files, modes
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[hdr.Name], modes[hdr.Name] = data, os.FileMode(hdr.Mode).Perm()
	}
}

// checkSums verifies SHA256SUMS in dir as sha256sum -c would, and returns the
// files it names.
func checkSums(t *testing.T, dir string) []string {
	t.Helper()
	g := NewWithT(t)
	f, err := os.Open(filepath.Join(dir, Checksums))
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = f.Close() }()
	var names []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		g.Expect(ok).To(BeTrue(), "line %q is `<sha256>  <file>`", sc.Text())
		data, err := os.ReadFile(filepath.Join(dir, name))
		g.Expect(err).NotTo(HaveOccurred())
		got := sha256.Sum256(data)
		g.Expect(hex.EncodeToString(got[:])).To(Equal(sum), name)
		names = append(names, name)
	}
	g.Expect(sc.Err()).NotTo(HaveOccurred())
	return names
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestArchive packs binaries of two platforms: archives named after version
// and platform, each with the binary (executable) and the license, the right
// checksums, the same bytes when packed again, and a krew manifest whose
// platforms point at the archives with their checksums.
func TestArchive(t *testing.T) {
	g := NewWithT(t)
	src := t.TempDir()
	license := writeFile(t, src, "LICENSE", "the license\n")
	linux := writeFile(t, src, "sharder-linux", "linux binary")
	windows := writeFile(t, src, "sharder.exe", "windows binary")
	opts := func(out string) Options {
		return Options{
			Version: "v1.2.3-rc.1", Out: out, License: license, KrewTemplate: "krew.yaml.tmpl",
			Binaries: []Binary{{OS: "windows", Arch: "arm64", Path: windows}, {OS: "linux", Arch: "amd64", Path: linux}},
		}
	}
	out := filepath.Join(t.TempDir(), "dist")
	archives, err := Archive(opts(out))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(archives).To(HaveLen(2))
	g.Expect(archives[0].Name).To(Equal("sharder_1.2.3-rc.1_linux_amd64.tar.gz"))
	g.Expect(archives[1].Name).To(Equal("sharder_1.2.3-rc.1_windows_arm64.zip"))
	g.Expect(checkSums(t, out)).To(Equal([]string{archives[0].Name, archives[1].Name}))

	files, modes := readArchive(t, filepath.Join(out, archives[0].Name))
	g.Expect(files).To(Equal(map[string][]byte{"sharder": []byte("linux binary"), "LICENSE": []byte("the license\n")}))
	g.Expect(modes["sharder"]).To(Equal(os.FileMode(0o755)))
	files, modes = readArchive(t, filepath.Join(out, archives[1].Name))
	g.Expect(files).To(Equal(map[string][]byte{"sharder.exe": []byte("windows binary"), "LICENSE": []byte("the license\n")}))
	g.Expect(modes["sharder.exe"]).To(Equal(os.FileMode(0o755)))

	again, err := Archive(opts(filepath.Join(t.TempDir(), "dist")))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(again).To(Equal(archives), "the same binaries give the same archives")

	manifest, err := os.ReadFile(filepath.Join(out, KrewManifest))
	g.Expect(err).NotTo(HaveOccurred())
	var plugin krewPlugin
	g.Expect(yaml.UnmarshalStrict(manifest, &plugin)).To(Succeed(), string(manifest))
	g.Expect(plugin.APIVersion).To(Equal("krew.googlecontainertools.github.com/v1alpha2"))
	g.Expect(plugin.Kind).To(Equal("Plugin"))
	g.Expect(plugin.Metadata.Name).To(Equal("sharder"))
	g.Expect(plugin.Spec.Version).To(Equal("v1.2.3-rc.1"))
	g.Expect(plugin.Spec.Homepage).To(Equal("https://github.com/sharder-dev/sharder"))
	g.Expect(plugin.Spec.ShortDescription).NotTo(BeEmpty())
	g.Expect(plugin.Spec.Description).NotTo(BeEmpty())
	g.Expect(plugin.Spec.Platforms).To(HaveLen(2))
	for i, p := range plugin.Spec.Platforms {
		a := archives[i]
		g.Expect(p.Selector.MatchLabels).To(Equal(map[string]string{"os": a.OS, "arch": a.Arch}))
		g.Expect(p.URI).To(Equal("https://github.com/sharder-dev/sharder/releases/download/v1.2.3-rc.1/" + a.Name))
		g.Expect(p.SHA256).To(Equal(a.SHA256))
		g.Expect(p.Bin).To(Equal(a.Bin))
		g.Expect(p.Files).To(HaveLen(2))
		g.Expect(p.Files[0].From).To(Equal(a.Bin), "krew copies the binary it links as kubectl-sharder")
	}
}

// TestArchiveRefusesBadInput: a version that is no release tag, a platform
// given twice, a missing binary or license.
func TestArchiveRefusesBadInput(t *testing.T) {
	src := t.TempDir()
	license := writeFile(t, src, "LICENSE", "l")
	bin := writeFile(t, src, "sharder", "b")
	good := func() Options {
		return Options{Version: "v0.1.0", Out: t.TempDir(), License: license, Binaries: []Binary{{OS: "linux", Arch: "amd64", Path: bin}}}
	}
	for name, tc := range map[string]struct {
		mutate func(*Options)
		want   string
	}{
		"no v":            {func(o *Options) { o.Version = "0.1.0" }, "want a release tag"},
		"describe output": {func(o *Options) { o.Version = "v0.1.0-3-gabcdef0-dirty" }, ""},
		"build metadata":  {func(o *Options) { o.Version = "v0.1.0+build" }, "want a release tag"},
		"twice":           {func(o *Options) { o.Binaries = append(o.Binaries, o.Binaries[0]) }, "two binaries for linux/amd64"},
		"no binary":       {func(o *Options) { o.Binaries = nil }, "no binary given"},
		"missing binary":  {func(o *Options) { o.Binaries[0].Path = filepath.Join(src, "none") }, "linux/amd64"},
		"missing license": {func(o *Options) { o.License = filepath.Join(src, "none") }, "reading the license"},
	} {
		t.Run(name, func(t *testing.T) {
			o := good()
			tc.mutate(&o)
			_, err := Archive(o)
			if tc.want == "" {
				// git describe's form of a commit after a tag is a valid
				// pre-release: a snapshot build may be packed too.
				NewWithT(t).Expect(err).NotTo(HaveOccurred())
				return
			}
			NewWithT(t).Expect(err).To(MatchError(ContainSubstring(tc.want)))
		})
	}
}

const changelog = `# Changelog

Intro.

## [Unreleased]

### Added

- Something new.

## [0.2.0] - 2027-01-02

### Changed

- **A change.** What users must do.

## [0.1.0] - 2026-12-01

### Added

- The first release.

[Unreleased]: https://github.com/sharder-dev/sharder/compare/v0.2.0...HEAD
[0.2.0]: https://github.com/sharder-dev/sharder/compare/v0.1.0...v0.2.0
[0.1.0]: https://github.com/sharder-dev/sharder/releases/tag/v0.1.0
`

// TestNotes takes a version's changelog section, and refuses a version
// without one: no release goes out without its entry.
func TestNotes(t *testing.T) {
	g := NewWithT(t)
	notes, err := Notes(changelog, "v0.2.0")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(notes).To(Equal("### Changed\n\n- **A change.** What users must do.\n"))
	notes, err = Notes(changelog, "v0.1.0")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(notes).To(Equal("### Added\n\n- The first release.\n"), "the link definitions are no part of the last section")
	_, err = Notes(changelog, "v0.3.0")
	g.Expect(err).To(MatchError(ContainSubstring("no entry for v0.3.0")))
	_, err = Notes(changelog, "0.2.0")
	g.Expect(err).To(MatchError(ContainSubstring("want a release tag")))
}
