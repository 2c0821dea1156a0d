package memberrestore

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"
)

// Config says which snapshot to restore, as which member.
type Config struct {
	// Endpoint is the store's URL (http:// or https://); empty: AWS S3.
	Endpoint, Region string
	Bucket, Key      string
	// AccessKeyID and SecretAccessKey read the snapshot.
	AccessKeyID, SecretAccessKey string

	// Name, PeerURLs, InitialCluster and InitialClusterToken are the
	// member's etcd settings: the restored member must be the one etcd
	// will start as.
	Name                string
	PeerURLs            []string
	InitialCluster      string
	InitialClusterToken string
	// InitialClusterState is "new" for a member that bootstraps the
	// restored cluster, "existing" for one that joins it later (a member
	// added by a scale-up or replaced after it lost its data): that one
	// gets its data from the leader and restores nothing.
	InitialClusterState string
	// DataDir is etcd's data directory (--data-dir).
	DataDir string
	// SkipHashCheck skips the snapshot's integrity check.
	SkipHashCheck bool
}

// FromEnv reads a Config from the environment the init container has: the
// etcd container's own ETCD_* variables and the RESTORE_* and AWS_* ones
// the operator adds.
func FromEnv(getenv func(string) string) (Config, error) {
	c := Config{
		Endpoint:            getenv("RESTORE_S3_ENDPOINT"),
		Region:              getenv("RESTORE_S3_REGION"),
		Bucket:              getenv("RESTORE_S3_BUCKET"),
		Key:                 getenv("RESTORE_S3_KEY"),
		AccessKeyID:         getenv("AWS_ACCESS_KEY_ID"),
		SecretAccessKey:     getenv("AWS_SECRET_ACCESS_KEY"),
		Name:                getenv("ETCD_NAME"),
		InitialCluster:      getenv("ETCD_INITIAL_CLUSTER"),
		InitialClusterToken: getenv("ETCD_INITIAL_CLUSTER_TOKEN"),
		InitialClusterState: getenv("ETCD_INITIAL_CLUSTER_STATE"),
		DataDir:             getenv("ETCD_DATA_DIR"),
	}
	if p := getenv("ETCD_INITIAL_ADVERTISE_PEER_URLS"); p != "" {
		c.PeerURLs = strings.Split(p, ",")
	}
	if v := getenv("RESTORE_SKIP_HASH_CHECK"); v != "" {
		skip, err := strconv.ParseBool(v)
		if err != nil {
			return c, fmt.Errorf("RESTORE_SKIP_HASH_CHECK=%q: %w", v, err)
		}
		c.SkipHashCheck = skip
	}
	var missing []string
	for name, v := range map[string]string{
		"RESTORE_S3_BUCKET": c.Bucket, "RESTORE_S3_KEY": c.Key, "AWS_ACCESS_KEY_ID": c.AccessKeyID,
		"AWS_SECRET_ACCESS_KEY": c.SecretAccessKey, "ETCD_NAME": c.Name, "ETCD_INITIAL_CLUSTER": c.InitialCluster,
		"ETCD_DATA_DIR": c.DataDir, "ETCD_INITIAL_ADVERTISE_PEER_URLS": strings.Join(c.PeerURLs, ","),
	} {
		if v == "" {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return c, fmt.Errorf("missing environment: %s", strings.Join(missing, ", "))
	}
	return c, nil
}

// Run restores the snapshot into cfg.DataDir, unless the directory exists:
// the member then has data of its own (it restored before, or ran), which
// a restore must not replace; or unless the member joins the running
// cluster (InitialClusterState "existing"). It reports whether it restored. The
// directory appears only once whole: a restore cut short leaves it absent
// and the next run starts over.
func Run(ctx context.Context, cfg Config, lg *zap.Logger) (bool, error) {
	if cfg.InitialClusterState == "existing" {
		// A snapshot restored here would make the member the first of a
		// cluster of its own, which the running one refuses.
		lg.Info("The member joins the running cluster: nothing to restore", zap.String("member", cfg.Name))
		return false, nil
	}
	if _, err := os.Stat(cfg.DataDir); err == nil {
		lg.Info("Data directory exists: nothing to restore", zap.String("dataDir", cfg.DataDir))
		return false, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return false, err
	}
	parent := filepath.Dir(cfg.DataDir)
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return false, err
	}
	snapPath := cfg.DataDir + ".snapshot"
	partial := cfg.DataDir + ".restoring"
	for _, p := range []string{snapPath, partial} {
		if err := os.RemoveAll(p); err != nil {
			return false, err
		}
	}
	defer func() { _ = os.Remove(snapPath) }()

	if err := download(ctx, cfg, snapPath); err != nil {
		return false, err
	}
	lg.Info("Downloaded snapshot", zap.String("bucket", cfg.Bucket), zap.String("key", cfg.Key))
	err := snapshot.NewV3(lg).Restore(snapshot.RestoreConfig{
		SnapshotPath:        snapPath,
		Name:                cfg.Name,
		OutputDataDir:       partial,
		PeerURLs:            cfg.PeerURLs,
		InitialCluster:      cfg.InitialCluster,
		InitialClusterToken: cfg.InitialClusterToken,
		SkipHashCheck:       cfg.SkipHashCheck,
	})
	if err != nil {
		_ = os.RemoveAll(partial)
		return false, fmt.Errorf("restoring the snapshot: %w", err)
	}
	if err := os.Rename(partial, cfg.DataDir); err != nil {
		return false, err
	}
	lg.Info("Restored the member's data", zap.String("member", cfg.Name), zap.String("dataDir", cfg.DataDir))
	return true, nil
}

// download writes the snapshot to path, uncompressed (a key ending .gz is
// gzip-compressed).
func download(ctx context.Context, cfg Config, path string) error {
	host, secure := "s3.amazonaws.com", true
	if cfg.Endpoint != "" {
		u, err := url.Parse(cfg.Endpoint)
		if err != nil || u.Host == "" {
			return fmt.Errorf("endpoint %q is not a URL of a host", cfg.Endpoint)
		}
		host, secure = u.Host, u.Scheme == "https"
	}
	cli, err := minio.New(host, &minio.Options{
		Creds: credentials.NewStaticV4(cfg.AccessKeyID, cfg.SecretAccessKey, ""), Secure: secure, Region: cfg.Region,
	})
	if err != nil {
		return fmt.Errorf("S3 client: %w", err)
	}
	obj, err := cli.GetObject(ctx, cfg.Bucket, cfg.Key, minio.GetObjectOptions{})
	if err != nil {
		return fmt.Errorf("reading s3://%s/%s: %w", cfg.Bucket, cfg.Key, err)
	}
	defer func() { _ = obj.Close() }()
	var body io.Reader = obj
	if strings.HasSuffix(cfg.Key, ".gz") {
		zr, err := gzip.NewReader(obj)
		if err != nil {
			return fmt.Errorf("reading s3://%s/%s: %w", cfg.Bucket, cfg.Key, err)
		}
		defer func() { _ = zr.Close() }()
		body = zr
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, body); err != nil {
		_ = f.Close()
		return fmt.Errorf("reading s3://%s/%s: %w", cfg.Bucket, cfg.Key, err)
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
