package main

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	. "github.com/onsi/gomega"
)

// buildPause builds the pause command statically for Linux on arch, as make
// images does.
func buildPause(t *testing.T, arch string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "pause")
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, "../pause")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building pause for %s: %v\n%s", arch, err, b)
	}
	return out
}

func TestWriteImage(t *testing.T) {
	g := NewWithT(t)
	bin := buildPause(t, runtime.GOARCH)
	out := filepath.Join(t.TempDir(), "pause.tar")
	spec := Spec{Binaries: []Binary{{Platform: hostPlatform(), File: bin}}, Path: "/usr/local/bin/pause", Ref: "example.dev/pause:1.0", User: NonRootUser, Cmd: []string{"a", "b"}}

	written, err := WriteTarball(spec, hostPlatform(), out)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(written).To(BeTrue())

	tag := name.MustParseReference("example.dev/pause:1.0").(name.Tag)
	img, err := tarball.ImageFromPath(out, &tag)
	g.Expect(err).NotTo(HaveOccurred(), "the tarball holds the image under its reference")
	cfg, err := img.ConfigFile()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(cfg.OS).To(Equal("linux"))
	g.Expect(cfg.Architecture).To(Equal(runtime.GOARCH))
	g.Expect(cfg.Config.Entrypoint).To(Equal([]string{"/usr/local/bin/pause"}))
	g.Expect(cfg.Config.Cmd).To(Equal([]string{"a", "b"}))
	g.Expect(cfg.Config.User).To(Equal("65532:65532"))
	g.Expect(cfg.Config.Labels).To(HaveKeyWithValue("org.opencontainers.image.version", "1.0"))

	layers, err := img.Layers()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(layers).To(HaveLen(1))
	rc, err := layers[0].Uncompressed()
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = rc.Close() }()
	files := map[string]*tar.Header{}
	contents := map[string][]byte{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		g.Expect(err).NotTo(HaveOccurred())
		files[h.Name] = h
		contents[h.Name], _ = io.ReadAll(tr)
	}
	g.Expect(files).To(HaveKey("usr/"))
	g.Expect(files).To(HaveKey("usr/local/bin/"))
	g.Expect(files).To(HaveKey("tmp/"))
	g.Expect(files["tmp/"].Mode).To(Equal(int64(0o1777)))
	g.Expect(files["home/nonroot/"].Uid).To(Equal(65532))
	g.Expect(string(contents["etc/passwd"])).To(ContainSubstring("nonroot:x:65532:65532:"))
	g.Expect(string(contents["etc/group"])).To(ContainSubstring("nonroot:x:65532:"))
	g.Expect(files["usr/local/bin/pause"].Mode).To(Equal(int64(0o755)))
	want, _ := os.ReadFile(bin)
	g.Expect(bytes.Equal(contents["usr/local/bin/pause"], want)).To(BeTrue(), "the binary is packed unchanged")

	// The same binary gives the same image: nothing is rewritten.
	before, _ := os.Stat(out)
	written, err = WriteTarball(spec, hostPlatform(), out)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(written).To(BeFalse())
	after, _ := os.Stat(out)
	g.Expect(after.ModTime()).To(Equal(before.ModTime()))

	// Another reference is another tarball.
	spec.Ref = "example.dev/pause:2.0"
	written, err = WriteTarball(spec, hostPlatform(), out)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(written).To(BeTrue())
}

// TestWriteImageWithLayers: each of Spec.Layers is one more layer, in order,
// with its files at their paths (executable or not, as the source is), and
// Spec.Entrypoint replaces the binary as the entrypoint.
func TestWriteImageWithLayers(t *testing.T) {
	g := NewWithT(t)
	bin := buildPause(t, runtime.GOARCH)
	dir := t.TempDir()
	script := filepath.Join(dir, "run.sh")
	g.Expect(os.WriteFile(script, []byte("#!/bin/sh\nexec /bin/sh \"$@\"\n"), 0o700)).To(Succeed())
	notes := filepath.Join(dir, "notes")
	g.Expect(os.WriteFile(notes, []byte("notes"), 0o600)).To(Succeed())
	spec := Spec{
		Binaries: []Binary{{Platform: hostPlatform(), File: bin}}, Path: "/bin/sh", Ref: "example.dev/shell:1.0", User: NonRootUser,
		Layers: []Layer{
			{Files: []LayerFile{{Path: "/usr/local/bin/run.sh", Source: script}}},
			{Files: []LayerFile{{Path: "/usr/share/doc/notes", Source: notes}, {Path: "/usr/local/bin/tool", Source: bin}}},
		},
		Entrypoint: []string{"/usr/local/bin/run.sh"},
	}
	out := filepath.Join(t.TempDir(), "shell.tar")
	written, err := WriteTarball(spec, hostPlatform(), out)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(written).To(BeTrue())

	tag := name.MustParseReference("example.dev/shell:1.0").(name.Tag)
	img, err := tarball.ImageFromPath(out, &tag)
	g.Expect(err).NotTo(HaveOccurred())
	cfg, err := img.ConfigFile()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(cfg.Config.Entrypoint).To(Equal([]string{"/usr/local/bin/run.sh"}))
	g.Expect(cfg.History).To(HaveLen(3))
	g.Expect(cfg.History[2].CreatedBy).To(Equal("hack/images: notes tool"))
	layers, err := img.Layers()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(layers).To(HaveLen(3))
	entries := func(l v1.Layer) map[string]*tar.Header {
		rc, err := l.Uncompressed()
		g.Expect(err).NotTo(HaveOccurred())
		defer func() { _ = rc.Close() }()
		files := map[string]*tar.Header{}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				return files
			}
			g.Expect(err).NotTo(HaveOccurred())
			files[h.Name] = h
		}
	}
	g.Expect(entries(layers[0])).To(HaveKey("bin/sh"))
	second := entries(layers[1])
	g.Expect(second).To(HaveKey("usr/local/bin/"))
	g.Expect(second).To(HaveKeyWithValue("usr/local/bin/run.sh", HaveField("Mode", int64(0o755))))
	third := entries(layers[2])
	g.Expect(third).To(HaveKeyWithValue("usr/share/doc/notes", HaveField("Mode", int64(0o644))))
	g.Expect(third).To(HaveKeyWithValue("usr/local/bin/tool", HaveField("Size", BeNumerically(">", 0))))

	_, _, err = Build(Spec{Binaries: spec.Binaries, Path: "/bin/sh", Ref: "example.dev/shell:1.0",
		Layers: []Layer{{Files: []LayerFile{{Path: "relative", Source: script}}}}})
	g.Expect(err).To(MatchError(ContainSubstring("want an absolute file path")))
}

var (
	amd64 = v1.Platform{OS: "linux", Architecture: "amd64"}
	arm64 = v1.Platform{OS: "linux", Architecture: "arm64"}
)

func TestBuildRejectsBadInput(t *testing.T) {
	bin := buildPause(t, "amd64")
	notELF := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(notELF, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		spec Spec
		want string
	}{
		{"no tag", Spec{Binaries: []Binary{{amd64, bin}}, Path: "/pause", Ref: "example.dev/pause"}, "a tag is required"},
		{"relative path", Spec{Binaries: []Binary{{amd64, bin}}, Path: "pause", Ref: "example.dev/pause:1"}, "want an absolute file path"},
		{"not an executable", Spec{Binaries: []Binary{{amd64, notELF}}, Path: "/pause", Ref: "example.dev/pause:1"}, "not a Linux executable"},
		{"another architecture", Spec{Binaries: []Binary{{arm64, bin}}, Path: "/pause", Ref: "example.dev/pause:1"}, "not arm64"},
		{"not Linux", Spec{Binaries: []Binary{{v1.Platform{OS: "darwin", Architecture: "amd64"}, bin}}, Path: "/pause", Ref: "example.dev/pause:1"}, "Linux images"},
		{"a platform twice", Spec{Binaries: []Binary{{amd64, bin}, {amd64, bin}}, Path: "/pause", Ref: "example.dev/pause:1"}, "two binaries for linux/amd64"},
		{"no binary", Spec{Path: "/pause", Ref: "example.dev/pause:1"}, "no binary given"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := Build(tc.spec)
			NewWithT(t).Expect(err).To(MatchError(ContainSubstring(tc.want)))
		})
	}
}
