package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	. "github.com/onsi/gomega"
)

// TestMakePushTargets runs the Makefile's push and chart-push recipes, as the
// release workflow does, against a registry: the images' index digests and
// the chart's digest they leave for signing (bin/images/pushed.txt,
// bin/charts/pushed.txt) name what the registry holds. The images are small
// stand-ins written where the recipe reads its layouts (make's images step,
// which builds the real ones, is not run: make -o images).
func TestMakePushTargets(t *testing.T) {
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	root, err := filepath.Abs("../..")
	g.Expect(err).NotTo(HaveOccurred())
	if _, err := os.Stat(filepath.Join(root, "bin", "helm")); err != nil {
		t.Fatalf("helm not found in bin/: run `make tools` (make test installs it first)")
	}

	images := t.TempDir()
	build := exec.Command("go", "build", "-o", filepath.Join(images, "imagetool"), ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the image tool: %v\n%s", err, out)
	}
	bin := buildPause(t, runtime.GOARCH)
	for _, image := range []string{"sharder", "etcd-operator"} {
		spec := Spec{Binaries: []Binary{{Platform: hostPlatform(), File: bin}}, Path: "/pause", Ref: "ghcr.io/sharder-dev/" + image + ":1.0", User: NonRootUser}
		_, err := WriteLayout(spec, filepath.Join(images, "oci", image))
		g.Expect(err).NotTo(HaveOccurred())
	}

	addr := startRegistry(t)
	home := t.TempDir()
	charts := filepath.Join(t.TempDir(), "charts")
	runMake := func(args ...string) {
		t.Helper()
		cmd := exec.CommandContext(ctx, "make", append([]string{"-C", root, "--no-print-directory"}, args...)...)
		// helm keeps its registry logins and caches under these: none of
		// the user's own.
		cmd.Env = append(os.Environ(),
			"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
			"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
			"HELM_DATA_HOME="+filepath.Join(home, "data"),
			"HELM_REGISTRY_CONFIG="+filepath.Join(home, "registry.json"))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("make %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}

	runMake("-o", "images", "push", "IMAGES="+images, "REGISTRY="+addr+"/team", "TAG=t9", "INSECURE=true")
	pushed := lines(t, filepath.Join(images, "pushed.txt"))
	g.Expect(pushed).To(HaveLen(2))
	for i, image := range []string{"sharder", "etcd-operator"} {
		ref, err := name.NewDigest(pushed[i], name.Insecure)
		g.Expect(err).NotTo(HaveOccurred(), "pushed.txt names digests: %q", pushed[i])
		g.Expect(ref.Context().String()).To(Equal(addr + "/team/" + image))
		tag, err := name.NewTag(addr+"/team/"+image+":t9", name.Insecure)
		g.Expect(err).NotTo(HaveOccurred())
		tagged, err := remote.Head(tag, remote.WithContext(ctx))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(tagged.Digest.String()).To(Equal(ref.DigestStr()), "the digest to sign is the one the tag names")
	}

	runMake("chart-push", "CHARTS="+charts, "REGISTRY="+addr+"/team", "INSECURE=true")
	var digest string
	for _, line := range lines(t, filepath.Join(charts, "pushed.txt")) {
		if d, ok := strings.CutPrefix(line, "Digest: "); ok {
			digest = d
		}
	}
	g.Expect(digest).To(HavePrefix("sha256:"), "helm reported the chart's digest")
	ref, err := name.NewDigest(addr+"/team/charts/sharder@"+digest, name.Insecure)
	g.Expect(err).NotTo(HaveOccurred())
	_, err = remote.Get(ref, remote.WithContext(ctx))
	g.Expect(err).NotTo(HaveOccurred(), "the chart's digest to sign is in the registry")
}

// lines returns the non-empty lines of a file.
func lines(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			out = append(out, l)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
