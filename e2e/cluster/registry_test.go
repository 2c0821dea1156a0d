package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"sigs.k8s.io/yaml"
)

// The suite's registry. make cluster has containerd pull images named
// registryHost/... from there over plain HTTP (hack/cluster); the suite
// serves it, pushes the sharder's and the example operator's images (make
// push) and the chart (make chart-push) to registryRepo, and installs the
// chart from it as a user installs a published release.
const (
	registryHost = "127.0.0.1:16500"
	registryRepo = registryHost + "/e2e"
	// registryTag is the images' tag in the registry: not the one make
	// cluster imports, so that a pod running it was pulled.
	registryTag = "e2e"
)

// published is what startRegistry pushed.
var published struct {
	// sharderImage is registryRepo/sharder:registryTag's digest reference.
	sharderImage name.Digest
	// chartVersion is the chart's version, at oci://registryRepo/charts/sharder.
	chartVersion string
}

// startRegistry serves an OCI registry (go-containerregistry's, in memory) at
// registryHost and pushes the images and the chart into it with the
// Makefile's release targets. stop ends it.
func startRegistry() (stop func(), err error) {
	l, err := net.Listen("tcp", registryHost)
	if err != nil {
		return nil, fmt.Errorf("the suite's registry needs %s, which make cluster has containerd pull from: %w", registryHost, err)
	}
	srv := &http.Server{
		Handler:           registry.New(registry.Logger(log.New(io.Discard, "", 0))),
		ReadHeaderTimeout: 10 * time.Second,
	}
	go func() { _ = srv.Serve(l) }()
	stop = func() { _ = srv.Close() }
	if err := pushRelease(); err != nil {
		stop()
		return nil, err
	}
	return stop, nil
}

// pushRelease runs make push (the images make test built, not built again)
// and make chart-push against the suite's registry.
func pushRelease() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	charts, err := os.MkdirTemp(toolHome, "charts-")
	if err != nil {
		return err
	}
	for _, args := range [][]string{
		{"-o", "images", "push", "REGISTRY=" + registryRepo, "TAG=" + registryTag, "INSECURE=true"},
		{"chart-push", "CHARTS=" + charts, "REGISTRY=" + registryRepo, "INSECURE=true"},
	} {
		cmd := exec.CommandContext(ctx, "make", append([]string{"--no-print-directory", "-C", repoRoot}, args...)...)
		cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(toolHome, "helm", "cache"),
			"HELM_CONFIG_HOME="+filepath.Join(toolHome, "helm", "config"), "HELM_DATA_HOME="+filepath.Join(toolHome, "helm", "data"))
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("make %s: %w", strings.Join(args, " "), err)
		}
	}

	tag, err := name.NewTag(registryRepo+"/sharder:"+registryTag, name.Insecure)
	if err != nil {
		return err
	}
	desc, err := remote.Head(tag, remote.WithContext(ctx))
	if err != nil {
		return fmt.Errorf("the pushed sharder image: %w", err)
	}
	published.sharderImage = tag.Context().Digest(desc.Digest.String())

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
