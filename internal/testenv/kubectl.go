package testenv

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// Kubectl runs the control plane's kubectl as the admin user with stdin and
// returns its standard output; the test fails when kubectl does.
func (e *Env) Kubectl(t testing.TB, stdin []byte, args ...string) []byte {
	t.Helper()
	dir, err := AssetsDir()
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := e.WriteKubeConfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(dir, "kubectl"), append([]string{"--kubeconfig", kubeconfig}, args...)...) //nolint:gosec // the control plane's own kubectl
	cmd.Stdin = bytes.NewReader(stdin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s\n%s", strings.Join(args, " "), err, stderr.String(), out)
	}
	return out
}

// Kustomize builds the kustomization in dir with kubectl and returns the
// manifests and their objects.
func (e *Env) Kustomize(t testing.TB, dir string) ([]byte, []*unstructured.Unstructured) {
	t.Helper()
	out := e.Kubectl(t, nil, "kustomize", dir)
	objs, err := DecodeObjects(out)
	if err != nil {
		t.Fatalf("decoding the output of kustomize %s: %v", dir, err)
	}
	return out, objs
}

// DecodeObjects decodes a stream of YAML or JSON documents, skipping empty ones.
func DecodeObjects(manifests []byte) ([]*unstructured.Unstructured, error) {
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(manifests), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return objs, err
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
}
