package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"sigs.k8s.io/yaml"
)

// The suite's registry. make cluster has containerd pull images named
// registryHost/... from there over plain HTTP (hack/cluster); the suite
// serves it, pushes the chart to registryRepo (make chart-push) and installs
// it from there as a user installs a published release, and has the node
// pull an image from it.
//
// The pulled image is not the sharder's: containerd's CRI image service
// forgets the name an image was imported under (make cluster imports the
// images every manifest of the suite names, ghcr.io/sharder-dev/...) once
// the same image is pulled under another name, and the pods of later steps
// would then try to pull them from ghcr.io. So the registry serves an image
// of its own (the pause binary under another path, so another image ID),
// pushed from an OCI layout as make push pushes (the make push recipe itself
// is tested against a registry in hack/images).
const (
	registryHost = "127.0.0.1:16500"
	registryRepo = registryHost + "/e2e"
	// registryTag is the pulled image's tag in the registry.
	registryTag = "e2e"
)

// published is what startRegistry pushed.
var published struct {
	// pulledImage is the digest reference of registryRepo/pause:registryTag,
	// an image only the registry has.
	pulledImage name.Digest
	// chartVersion is the chart's version, at oci://registryRepo/charts/sharder.
	chartVersion string
}

// startRegistry runs an OCI registry at registryHost (distribution's,
// bin/registry, built from Go modules by make registry, with
// hack/registry.yaml), storing in a folder of toolHome, and pushes the
// images and the chart into it with the Makefile's release targets. stop
// ends it.
func startRegistry() (stop func(), err error) {
	// The address must be free: a registry already there would get the
	// pushes, and the registry started here would fail to listen.
	l, err := net.Listen("tcp", registryHost)
	if err != nil {
		return nil, fmt.Errorf("the suite's registry needs %s, which make cluster has containerd pull from: %w", registryHost, err)
	}
	_ = l.Close()
	dir, err := os.MkdirTemp(toolHome, "registry-")
	if err != nil {
		return nil, err
	}
	logFile, err := os.Create(filepath.Join(dir, "registry.log"))
	if err != nil {
		return nil, err
	}
	// The configuration users serve it with (docs/real-cluster.md), blobs
	// in the suite's folder.
	cmd := exec.Command(filepath.Join(repoRoot, "bin", "registry"), "serve", filepath.Join(repoRoot, "hack", "registry.yaml"))
	cmd.Env = append(os.Environ(), "REGISTRY_STORAGE_FILESYSTEM_ROOTDIRECTORY="+filepath.Join(dir, "data"))
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("starting the suite's registry (make registry builds it): %w", err)
	}
	// exited is closed once the process ended, with waitErr set.
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); _ = logFile.Close(); close(exited) }()
	stop = func() { stopProcess(cmd.Process, exited, 10*time.Second) }
	if err := waitRegistry(exited, &waitErr); err != nil {
		stop()
		return nil, fmt.Errorf("the suite's registry at %s: %w; its log:\n%s", registryHost, err, fileTail(filepath.Join(dir, "registry.log")))
	}
	if err := pushRelease(); err != nil {
		stop()
		return nil, err
	}
	return stop, nil
}

// waitRegistry waits until the registry answers its API's base endpoint,
// or its process has ended.
func waitRegistry(exited <-chan struct{}, waitErr *error) error {
	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := client.Get("http://" + registryHost + "/v2/")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("GET /v2/: %s", resp.Status)
		}
		select {
		case <-exited:
			return fmt.Errorf("the registry exited: %w", *waitErr)
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not serving after a minute: %w", err)
		}
	}
}

// stopProcess asks a process the suite started to end (SIGTERM) and kills
// it after grace; done is closed once it ended.
func stopProcess(p *os.Process, done <-chan struct{}, grace time.Duration) {
	_ = p.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(grace):
		_ = p.Kill()
		<-done
	}
}

// fileTail returns the last lines of a file, for an error message.
func fileTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	return tail(string(b), 20)
}

// pushRelease runs make chart-push against the suite's registry, and packs
// and pushes the image the node pulls, with the image tool make images and
// make push run (built by make images).
func pushRelease() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	work, err := os.MkdirTemp(toolHome, "registry-")
	if err != nil {
		return err
	}
	images := filepath.Join(repoRoot, "bin", "images")
	arch := runtime.GOARCH
	for _, args := range [][]string{
		{"make", "--no-print-directory", "-C", repoRoot, "chart-push", "CHARTS=" + filepath.Join(work, "charts"), "REGISTRY=" + registryRepo, "INSECURE=true"},
		{filepath.Join(images, "imagetool"), "pack", "--binary", "linux/" + arch + "=" + filepath.Join(images, "linux-"+arch, "pause"),
			"--path", "/registry-pause", "--ref", "ghcr.io/sharder-dev/pause:" + registryTag,
			"--output", filepath.Join(work, "pause.tar"), "--layout", filepath.Join(work, "oci", "pause")},
		{filepath.Join(images, "imagetool"), "push", "--registry", registryRepo, "--tag", registryTag, "--insecure", filepath.Join(work, "oci", "pause")},
	} {
		cmd := exec.CommandContext(ctx, args[0], args[1:]...)
		cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(toolHome, "helm", "cache"),
			"HELM_CONFIG_HOME="+filepath.Join(toolHome, "helm", "config"), "HELM_DATA_HOME="+filepath.Join(toolHome, "helm", "data"))
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%s: %w", strings.Join(args, " "), err)
		}
	}

	tag, err := name.NewTag(registryRepo+"/pause:"+registryTag, name.Insecure)
	if err != nil {
		return err
	}
	desc, err := remote.Head(tag, remote.WithContext(ctx))
	if err != nil {
		return fmt.Errorf("the pushed image: %w", err)
	}
	published.pulledImage = tag.Context().Digest(desc.Digest.String())

	data, err := os.ReadFile(filepath.Join(repoRoot, "charts", "sharder", "Chart.yaml"))
	if err != nil {
		return err
	}
	var chart struct {
		Version string `json:"version"`
	}
	if err := yaml.Unmarshal(data, &chart); err != nil {
		return err
	}
	if chart.Version == "" {
		return errors.New("charts/sharder/Chart.yaml has no version")
	}
	published.chartVersion = chart.Version
	return nil
}
