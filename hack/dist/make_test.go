package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

// repoRoot is the repository's root, two folders up.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// TestMakeDist runs make dist for this machine's platform, as the release
// workflow runs it for every platform: the archive's checksum is in
// SHA256SUMS, the krew manifest names it, and the binary in it runs and
// reports the version it was built for.
func TestMakeDist(t *testing.T) {
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	root := repoRoot(t)
	dist := filepath.Join(t.TempDir(), "dist")
	const version = "v9.8.7-test.1"
	cmd := exec.CommandContext(ctx, "make", "-C", root, "--no-print-directory", "dist",
		"DIST="+dist, "DIST_PLATFORMS="+runtime.GOOS+"/"+runtime.GOARCH, "VERSION="+version)
	out, err := cmd.CombinedOutput()
	g.Expect(err).NotTo(HaveOccurred(), "make dist:\n%s", out)

	ext, archive := "", ".tar.gz"
	if runtime.GOOS == "windows" {
		ext, archive = ".exe", ".zip"
	}
	name := "sharder_9.8.7-test.1_" + runtime.GOOS + "_" + runtime.GOARCH + archive
	g.Expect(checkSums(t, dist)).To(Equal([]string{name}))
	entries, err := os.ReadDir(dist)
	g.Expect(err).NotTo(HaveOccurred())
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	g.Expect(names).To(ConsistOf(name, Checksums, KrewManifest), "what the release publishes, and nothing else")
	manifest, err := os.ReadFile(filepath.Join(dist, KrewManifest))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(manifest)).To(ContainSubstring("/releases/download/" + version + "/" + name))

	files, _ := readArchive(t, filepath.Join(dist, name))
	bin := filepath.Join(t.TempDir(), "sharder"+ext)
	g.Expect(os.WriteFile(bin, files["sharder"+ext], 0o700)).To(Succeed())
	out, err = exec.CommandContext(ctx, bin, "version", "--client").CombinedOutput()
	g.Expect(err).NotTo(HaveOccurred(), string(out))
	g.Expect(string(out)).To(ContainSubstring(version))
}

// makeCall finds `make <target>` in a workflow's run steps.
var makeCall = regexp.MustCompile(`(?:^|[\s;&|(])make\s+([a-z][a-z0-9-]*)`)

// TestWorkflows lints the GitHub Actions workflows with actionlint (their
// syntax, expressions, the inputs of the actions they use) and checks that
// every make target they call is one of the Makefile's, and that the
// release publishes only with targets the tests run: push and chart-push
// (hack/images TestMakePushTargets), dist (TestMakeDist).
func TestWorkflows(t *testing.T) {
	g := NewWithT(t)
	root := repoRoot(t)
	actionlint := filepath.Join(root, "bin", "actionlint")
	if _, err := os.Stat(actionlint); err != nil {
		t.Fatalf("actionlint not found at %s: make test and make lint install it first", actionlint)
	}
	cmd := exec.Command(actionlint, "-no-color")
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	g.Expect(err).NotTo(HaveOccurred(), "actionlint:\n%s", out)

	workflows, err := filepath.Glob(filepath.Join(root, ".github", "workflows", "*.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(workflows).NotTo(BeEmpty())
	targets := map[string][]string{}
	for _, wf := range workflows {
		data, err := os.ReadFile(wf)
		g.Expect(err).NotTo(HaveOccurred())
		for line := range strings.Lines(string(data)) {
			if strings.HasPrefix(strings.TrimSpace(line), "#") {
				continue
			}
			for _, m := range makeCall.FindAllStringSubmatch(line, -1) {
				targets[filepath.Base(wf)] = append(targets[filepath.Base(wf)], m[1])
			}
		}
	}
	g.Expect(targets["release.yaml"]).To(ContainElements("push", "chart-push", "dist"))
	// test-compat runs the suites of make test against the oldest supported
	// API server: too long for make test's budget, it is a job of its own.
	tested := []string{"lint", "test", "test-compat", "push", "chart-push", "dist"}
	for wf, ts := range targets {
		for _, target := range ts {
			g.Expect(slices.Contains(tested, target)).To(BeTrue(), "%s calls make %s, which no test runs", wf, target)
			dry := exec.Command("make", "-C", root, "--no-print-directory", "-n", target, "REGISTRY=example.invalid", "TAG=0.0.0")
			out, err := dry.CombinedOutput()
			g.Expect(err).NotTo(HaveOccurred(), "%s calls make %s:\n%s", wf, target, strings.TrimSpace(string(out)))
		}
	}
}
