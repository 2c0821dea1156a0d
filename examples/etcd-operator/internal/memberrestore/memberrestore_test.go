package memberrestore

import (
	"os"
	"path/filepath"
	"testing"

	. "github.com/onsi/gomega"
	"go.uber.org/zap"
)

// TestFromEnv: the init container's environment gives the member's settings;
// a missing one or a bad flag is an error naming it.
func TestFromEnv(t *testing.T) {
	full := map[string]string{
		"RESTORE_S3_ENDPOINT": "http://s3.store.svc:7070", "RESTORE_S3_BUCKET": "backups", "RESTORE_S3_KEY": "db/main/x.db",
		"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "key",
		"ETCD_NAME": "main-1", "ETCD_INITIAL_CLUSTER": "main-0=http://a:2380,main-1=http://b:2380",
		"ETCD_INITIAL_CLUSTER_TOKEN": "t", "ETCD_INITIAL_CLUSTER_STATE": "new", "ETCD_DATA_DIR": "/var/lib/etcd/data",
		"ETCD_INITIAL_ADVERTISE_PEER_URLS": "http://b:2380", "RESTORE_SKIP_HASH_CHECK": "true",
	}
	g := NewWithT(t)
	cfg, err := FromEnv(func(k string) string { return full[k] })
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(cfg).To(Equal(Config{
		Endpoint: "http://s3.store.svc:7070", Bucket: "backups", Key: "db/main/x.db", AccessKeyID: "id", SecretAccessKey: "key",
		Name: "main-1", PeerURLs: []string{"http://b:2380"}, InitialCluster: "main-0=http://a:2380,main-1=http://b:2380",
		InitialClusterToken: "t", InitialClusterState: "new", DataDir: "/var/lib/etcd/data", SkipHashCheck: true,
	}))

	for _, name := range []string{"RESTORE_S3_BUCKET", "RESTORE_S3_KEY", "AWS_ACCESS_KEY_ID", "ETCD_NAME", "ETCD_DATA_DIR", "ETCD_INITIAL_ADVERTISE_PEER_URLS"} {
		_, err := FromEnv(func(k string) string {
			if k == name {
				return ""
			}
			return full[k]
		})
		g.Expect(err).To(MatchError(ContainSubstring(name)), name)
	}
	_, err = FromEnv(func(k string) string {
		if k == "RESTORE_SKIP_HASH_CHECK" {
			return "perhaps"
		}
		return full[k]
	})
	g.Expect(err).To(MatchError(ContainSubstring("RESTORE_SKIP_HASH_CHECK")))
}

// TestJoiningMemberRestoresNothing: a member that joins the restored cluster
// after it formed (scale-up, or replaced after it lost its data) starts
// with an empty data directory and gets its data from the leader; a
// snapshot restored into it would make it a cluster of its own. The store
// named here does not exist: nothing may be fetched from it.
func TestJoiningMemberRestoresNothing(t *testing.T) {
	g := NewWithT(t)
	dataDir := filepath.Join(t.TempDir(), "data")
	cfg := Config{
		Endpoint: "http://127.0.0.1:1", Bucket: "backups", Key: "db/main/x.db", AccessKeyID: "id", SecretAccessKey: "key",
		Name: "main-3", PeerURLs: []string{"http://d:2380"}, InitialCluster: "main-0=http://a:2380,main-3=http://d:2380",
		InitialClusterToken: "t", InitialClusterState: "existing", DataDir: dataDir,
	}
	restored, err := Run(t.Context(), cfg, zap.NewNop())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(restored).To(BeFalse())
	_, err = os.Stat(dataDir)
	g.Expect(os.IsNotExist(err)).To(BeTrue(), "the data directory stays absent for etcd to fill")

	// The same member bootstrapping the cluster would fetch the snapshot.
	cfg.InitialClusterState = "new"
	_, err = Run(t.Context(), cfg, zap.NewNop())
	g.Expect(err).To(HaveOccurred(), "the store does not exist")
}
