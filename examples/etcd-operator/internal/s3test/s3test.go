package s3test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/sharder-dev/sharder/internal/testenv"
)

// BinaryEnv names the versitygw binary when it is not bin/versitygw of the
// repository.
const BinaryEnv = "VERSITYGW"

// Server is a running store. It stops when the test ends.
type Server struct {
	// Endpoint is the store's URL: http://127.0.0.1:port.
	Endpoint string
	// AccessKeyID and SecretAccessKey are the root account's keys.
	AccessKeyID, SecretAccessKey string
	// Dir holds the buckets, one folder each.
	Dir string
}

// Start starts a store and waits until it answers. It fails the test if it
// cannot.
func Start(t testing.TB) *Server {
	t.Helper()
	binary := os.Getenv(BinaryEnv)
	if binary == "" {
		root, err := testenv.RepoRoot()
		if err != nil {
			t.Fatalf("s3test: %v", err)
		}
		binary = filepath.Join(root, "bin", "versitygw")
	}
	if _, err := os.Stat(binary); err != nil {
		t.Fatalf("s3test: versitygw not found (%v): run `make tools`, or set %s", err, BinaryEnv)
	}
	var lc net.ListenConfig
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("s3test: %v", err)
	}
	addr := l.Addr().String()
	_ = l.Close()

	s := &Server{
		Endpoint:        "http://" + addr,
		AccessKeyID:     "s3test",
		SecretAccessKey: "s3test-secret",
		Dir:             t.TempDir(),
	}
	logPath := filepath.Join(t.TempDir(), "versitygw.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatalf("s3test: %v", err)
	}
	defer func() { _ = logFile.Close() }()
	// Object metadata (multipart uploads need it) in a sidecar folder
	// rather than extended attributes, which not every file system has.
	cmd := exec.CommandContext(context.Background(), binary, //nolint:gosec // the store the project builds
		"--port", addr, "--health", "/health", "--quiet",
		"posix", "--sidecar", t.TempDir(), s.Dir)
	cmd.Env = append(os.Environ(), "ROOT_ACCESS_KEY="+s.AccessKeyID, "ROOT_SECRET_KEY="+s.SecretAccessKey)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatalf("s3test: starting versitygw: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	hc := &http.Client{Timeout: 2 * time.Second}
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.Endpoint+"/health", nil)
		if resp, err := hc.Do(req); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s
			}
		}
		select {
		case <-done:
			out, _ := os.ReadFile(logPath)
			t.Fatalf("s3test: versitygw exited:\n%s", out)
		case <-ctx.Done():
			out, _ := os.ReadFile(logPath)
			t.Fatalf("s3test: versitygw did not answer at %s:\n%s", s.Endpoint, out)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Client returns a client of the store with the root account's keys.
func (s *Server) Client(t testing.TB) *minio.Client {
	t.Helper()
	cli, err := minio.New(s.Endpoint[len("http://"):], &minio.Options{
		Creds: credentials.NewStaticV4(s.AccessKeyID, s.SecretAccessKey, ""),
	})
	if err != nil {
		t.Fatalf("s3test: %v", err)
	}
	return cli
}

// MakeBucket creates a bucket.
func (s *Server) MakeBucket(t testing.TB, name string) {
	t.Helper()
	if err := s.Client(t).MakeBucket(context.Background(), name, minio.MakeBucketOptions{}); err != nil {
		t.Fatalf("s3test: creating bucket %s: %v", name, err)
	}
}

// Keys lists the keys under prefix.
func (s *Server) Keys(ctx context.Context, t testing.TB, bucket, prefix string) ([]string, error) {
	t.Helper()
	var keys []string
	for obj := range s.Client(t).ListObjects(ctx, bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
		if obj.Err != nil {
			return nil, fmt.Errorf("listing %s/%s: %w", bucket, prefix, obj.Err)
		}
		keys = append(keys, obj.Key)
	}
	return keys, nil
}
