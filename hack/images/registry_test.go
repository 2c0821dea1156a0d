package main

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	. "github.com/onsi/gomega"
	"sigs.k8s.io/yaml"
)

// startRegistry serves an OCI distribution registry over plain HTTP on a
// loopback port the kernel picks, until the test ends, and returns its
// host:port. It is go-containerregistry's registry package: the distribution
// API (blobs, manifests, tags) in this process, kept in memory.
func startRegistry(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		Handler:           registry.New(registry.Logger(log.New(io.Discard, "", 0))),
		ReadHeaderTimeout: 10 * time.Second,
	}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return l.Addr().String()
}

// TestPushToRegistry packs an image for linux/amd64 and linux/arm64 as make
// images does, pushes it as make push does and reads it back from the
// registry: one index, each platform's config, and in each image a binary for
// that platform's machine.
func TestPushToRegistry(t *testing.T) {
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	machine := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}
	spec := Spec{Path: "/pause", Ref: "ghcr.io/sharder-dev/pause:1.0", User: NonRootUser}
	for _, p := range []v1.Platform{amd64, arm64} {
		spec.Binaries = append(spec.Binaries, Binary{Platform: p, File: buildPause(t, p.Architecture)})
	}
	dir := filepath.Join(t.TempDir(), "oci", "pause")
	written, err := WriteLayout(spec, dir)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(written).To(BeTrue())
	written, err = WriteLayout(spec, dir)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(written).To(BeFalse(), "the same binaries give the same layout, left untouched")

	addr := startRegistry(t)
	pushed, err := Push(ctx, dir, PushOptions{Registry: addr + "/team", Tag: "t1", Insecure: true})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(pushed.Context().String()).To(Equal(addr + "/team/pause"))

	ref, err := name.NewTag(addr+"/team/pause:t1", name.Insecure)
	g.Expect(err).NotTo(HaveOccurred())
	idx, err := remote.Index(ref, remote.WithContext(ctx))
	g.Expect(err).NotTo(HaveOccurred(), "the tag names an image index")
	digest, err := idx.Digest()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(digest.String()).To(Equal(pushed.DigestStr()))
	m, err := idx.IndexManifest()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(m.MediaType).To(Equal(types.OCIImageIndex))

	var platforms []string
	for _, desc := range m.Manifests {
		g.Expect(desc.Platform).NotTo(BeNil(), "every manifest in the index names its platform")
		platforms = append(platforms, desc.Platform.String())
		img, err := remote.Image(ref.Context().Digest(desc.Digest.String()), remote.WithContext(ctx))
		g.Expect(err).NotTo(HaveOccurred())
		cfg, err := img.ConfigFile()
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(cfg.OS).To(Equal("linux"))
		g.Expect(cfg.Architecture).To(Equal(desc.Platform.Architecture), "the config's architecture is the index's")
		g.Expect(cfg.Config.Entrypoint).To(Equal([]string{"/pause"}))

		layers, err := img.Layers()
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(layers).To(HaveLen(1))
		mt, err := layers[0].MediaType()
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(mt).To(Equal(types.OCILayer), "the pushed layer is gzip-compressed")
		bin := fileInLayer(t, layers[0], "pause")
		f, err := elf.NewFile(bytes.NewReader(bin))
		g.Expect(err).NotTo(HaveOccurred(), "the binary in the %s image is an ELF file", desc.Platform)
		g.Expect(f.Machine).To(Equal(machine[cfg.Architecture]), "the binary in the %s image", desc.Platform)
	}
	g.Expect(platforms).To(ConsistOf("linux/amd64", "linux/arm64"))
}

// fileInLayer returns the content of the file p in layer.
func fileInLayer(t *testing.T, layer v1.Layer, p string) []byte {
	t.Helper()
	rc, err := layer.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rc.Close() }()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			t.Fatalf("no %s in the layer", p)
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name == p {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
	}
}

// TestChartPushToRegistry packages the chart and pushes it to the registry as
// make chart-push does, then reads it back with helm as a user installing
// from oci:// would.
func TestChartPushToRegistry(t *testing.T) {
	g := NewWithT(t)
	root, err := filepath.Abs("../..")
	g.Expect(err).NotTo(HaveOccurred())
	helm := filepath.Join(root, "bin", "helm")
	if _, err := os.Stat(helm); err != nil {
		t.Fatalf("helm not found at %s: run `make tools` (make test installs it first)", helm)
	}
	var chart struct {
		Name    string `json:"name"`
		Version string `json:"version"`
	}
	data, err := os.ReadFile(filepath.Join(root, "charts", "sharder", "Chart.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(yaml.Unmarshal(data, &chart)).To(Succeed())

	// helm keeps its registry logins and caches under these: none of the
	// user's own.
	home := t.TempDir()
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(helm, args...)
		cmd.Env = append(os.Environ(),
			"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
			"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
			"HELM_DATA_HOME="+filepath.Join(home, "data"),
			"HELM_REGISTRY_CONFIG="+filepath.Join(home, "registry.json"))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}

	addr := startRegistry(t)
	dist := t.TempDir()
	run("package", filepath.Join(root, "charts", "sharder"), "--destination", dist)
	pkg := filepath.Join(dist, chart.Name+"-"+chart.Version+".tgz")
	out := run("push", pkg, "oci://"+addr+"/team/charts", "--plain-http")
	g.Expect(out).To(ContainSubstring(addr + "/team/charts/" + chart.Name + ":" + chart.Version))

	out = run("show", "chart", "oci://"+addr+"/team/charts/"+chart.Name, "--version", chart.Version, "--plain-http")
	var shown struct {
		Name       string `json:"name"`
		Version    string `json:"version"`
		AppVersion string `json:"appVersion"`
	}
	// helm show prints a "Pulled:" and a "Digest:" line before the chart.
	_, body, ok := strings.Cut(out, "\napiVersion:")
	g.Expect(ok).To(BeTrue(), "helm show chart printed a chart:\n%s", out)
	g.Expect(yaml.Unmarshal([]byte("apiVersion:"+body), &shown)).To(Succeed(), out)
	g.Expect(shown.Name).To(Equal(chart.Name))
	g.Expect(shown.Version).To(Equal(chart.Version))

	pulled := t.TempDir()
	run("pull", "oci://"+addr+"/team/charts/"+chart.Name, "--version", chart.Version, "--plain-http", "--destination", pulled)
	got, err := os.ReadFile(filepath.Join(pulled, chart.Name+"-"+chart.Version+".tgz"))
	g.Expect(err).NotTo(HaveOccurred())
	want, err := os.ReadFile(pkg)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(bytes.Equal(got, want)).To(BeTrue(), "helm pull gives back the package pushed")
}
