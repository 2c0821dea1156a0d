package controller

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	etcdv1alpha1 "github.com/sharder-dev/sharder/examples/etcd-operator/api/v1alpha1"
)

func testCluster(size int32) *etcdv1alpha1.EtcdCluster {
	return &etcdv1alpha1.EtcdCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: "db", Name: "main", UID: "u1"},
		Spec:       etcdv1alpha1.EtcdClusterSpec{Size: size},
	}
}

func TestSpecDefaults(t *testing.T) {
	c := testCluster(0)
	c.Spec.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")}
	s := spec(c)
	if s.Size != 3 || s.Version != etcdv1alpha1.DefaultVersion || s.Network.PeerPort != 2380 || s.Advanced.DataDir != "/var/lib/etcd" {
		t.Errorf("defaults not applied: %+v", s)
	}
	if got := s.Resources.Requests[corev1.ResourceCPU]; got.String() != "2" {
		t.Errorf("cpu request = %s; the spec's value must win", got.String())
	}
	if got := s.Resources.Requests[corev1.ResourceMemory]; got.String() != "128Mi" {
		t.Errorf("memory request = %s; want the default 128Mi", got.String())
	}
	if c.Spec.Size != 0 || len(c.Spec.Resources.Requests) != 1 {
		t.Error("spec() changed the cluster it was given")
	}
}

func TestConfigData(t *testing.T) {
	c := testCluster(3)
	c.Spec.Advanced.EtcdConfig = map[string]string{"heartbeat-interval": "200", "initial-cluster-state": "existing"}
	data := configData(c, spec(c))
	want := map[string]string{
		// The initial cluster is on each member's pod, never from etcdConfig.
		"ETCD_INITIAL_CLUSTER_TOKEN": "db-main-u1",
		"ETCD_DATA_DIR":              "/var/lib/etcd/data",
		"ETCD_HEARTBEAT_INTERVAL":    "200",
		"ETCD_LISTEN_CLIENT_URLS":    "http://0.0.0.0:2379",
		"ETCD_LISTEN_PEER_URLS":      "http://0.0.0.0:2380",
	}
	if len(data) != len(want) {
		t.Errorf("config has %d entries; want %d: %v", len(data), len(want), data)
	}
	for k, v := range want {
		if data[k] != v {
			t.Errorf("%s = %q; want %q", k, data[k], v)
		}
	}
	if hashData(data) != hashData(configData(c, spec(c))) {
		t.Error("the config hash is not stable")
	}
	c.Spec.Advanced.EtcdConfig["heartbeat-interval"] = "300"
	if hashData(data) == hashData(configData(c, spec(c))) {
		t.Error("the config hash ignores a changed setting")
	}
}

func TestPDBProtectsQuorum(t *testing.T) {
	for size, want := range map[int32]int32{1: 0, 3: 2, 5: 3} {
		c := testCluster(size)
		pdb := buildPDB(c, spec(c))
		if *pdb.Spec.MinAvailable != intstr.FromInt32(want) {
			t.Errorf("size %d: minAvailable = %v; want %d", size, pdb.Spec.MinAvailable, want)
		}
	}
}

func TestStatefulSetImageAndStorage(t *testing.T) {
	c := testCluster(5)
	c.Spec.Version = "3.5.21"
	c.Spec.Repository = "registry.example/etcd"
	class := "fast"
	c.Spec.Storage.StorageClassName = &class
	sts := buildStatefulSet(c, spec(c), "h", c.Spec.Size)
	if got := sts.Spec.Template.Spec.Containers[0].Image; got != "registry.example/etcd:v3.5.21" {
		t.Errorf("image = %q", got)
	}
	if *sts.Spec.Replicas != 5 {
		t.Errorf("replicas = %d", *sts.Spec.Replicas)
	}
	vct := sts.Spec.VolumeClaimTemplates[0]
	if *vct.Spec.StorageClassName != "fast" || vct.Spec.Resources.Requests.Storage().String() != "10Gi" {
		t.Errorf("volume claim = %+v", vct.Spec)
	}
	if sts.Spec.Template.Annotations[annotationConfigHash] != "h" {
		t.Error("config hash annotation missing")
	}
}

// TestStatefulSetEphemeralStorage: an emptyDir named as the claim would be,
// mounted at the data directory, and no volume claim.
func TestStatefulSetEphemeralStorage(t *testing.T) {
	c := testCluster(3)
	c.Spec.Storage.Ephemeral = true
	sts := buildStatefulSet(c, spec(c), "h", c.Spec.Size)
	if len(sts.Spec.VolumeClaimTemplates) != 0 {
		t.Errorf("volume claims: %+v", sts.Spec.VolumeClaimTemplates)
	}
	vols := sts.Spec.Template.Spec.Volumes
	if len(vols) != 1 || vols[0].Name != volumeName || vols[0].EmptyDir == nil {
		t.Errorf("volumes = %+v", vols)
	}
	mounts := sts.Spec.Template.Spec.Containers[0].VolumeMounts
	if len(mounts) != 1 || mounts[0].Name != volumeName || mounts[0].MountPath != etcdv1alpha1.DefaultDataDir {
		t.Errorf("mounts = %+v", mounts)
	}
}
