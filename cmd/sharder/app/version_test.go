package app

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

func runVersion(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := NewVersionCommand()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

func decodeVersion(g Gomega, out string) *VersionReport {
	report := &VersionReport{}
	g.Expect(json.Unmarshal([]byte(out), report)).To(Succeed(), out)
	return report
}

// TestVersionWithoutCluster: with no cluster to read, the command prints
// its own version, says why the cluster was not read, and succeeds.
func TestVersionWithoutCluster(t *testing.T) {
	g := NewWithT(t)
	withoutCluster(t)

	out, err := runVersion(t)
	g.Expect(err).NotTo(HaveOccurred(), out)
	g.Expect(out).To(HavePrefix("sharder " + Version() + " (" + runtime.Version() + ", " + runtime.GOOS + "/" + runtime.GOARCH + ")\n"))
	g.Expect(out).To(MatchRegexp(`(?m)^In the cluster: not read: no cluster to talk to: .*--kubeconfig`))

	out, err = runVersion(t, "-o", "json")
	g.Expect(err).NotTo(HaveOccurred(), out)
	report := decodeVersion(g, out)
	g.Expect(report.Client.Version).To(Equal(Version()))
	g.Expect(report.Client.Platform).To(Equal(runtime.GOOS + "/" + runtime.GOARCH))
	g.Expect(report.Cluster).NotTo(BeNil())
	g.Expect(report.Cluster.Sharders).To(BeEmpty())
	g.Expect(report.Cluster.Note).To(ContainSubstring("no cluster to talk to"))

	out, err = runVersion(t, "--client")
	g.Expect(err).NotTo(HaveOccurred(), out)
	g.Expect(out).To(Equal("sharder "+Version()+" ("+runtime.Version()+", "+runtime.GOOS+"/"+runtime.GOARCH+")\n"),
		"--client prints the one line versions before the cluster was read printed")

	out, err = runVersion(t, "--client", "-o", "yaml")
	g.Expect(err).NotTo(HaveOccurred(), out)
	report = &VersionReport{}
	g.Expect(yaml.UnmarshalStrict([]byte(out), report)).To(Succeed(), out)
	g.Expect(report.Cluster).To(BeNil())
	g.Expect(report.Client.GoVersion).To(Equal(runtime.Version()))
}

func TestVersionFlags(t *testing.T) {
	g := NewWithT(t)
	_, err := runVersion(t, "-o", "xml")
	g.Expect(err).To(MatchError(`invalid argument "xml" for "-o, --output" flag: must be table, json or yaml`))
	_, err = runVersion(t, "--lease", "sharder")
	g.Expect(err).To(MatchError(`--lease "sharder": must be NAMESPACE/NAME`))
}

// TestVersionReportsTheRunningSharder runs `sharder run` with leader
// election next to a pod named as its host, as a Deployment's pod is:
// `sharder version` finds the sharder by the label on its Lease and reports
// the version the leader wrote there and the image of its pod.
func TestVersionReportsTheRunningSharder(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := env().Namespace(t)
	host, err := os.Hostname()
	g.Expect(err).NotTo(HaveOccurred())
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: host},
		Spec: corev1.PodSpec{Containers: []corev1.Container{
			{Name: "proxy", Image: "example.dev/proxy:1"},
			{Name: "sharder", Image: "example.dev/sharder:9.9.9"},
		}},
	}
	g.Expect(env().Client.Create(ctx, pod)).To(Succeed())

	healthPort := freePort(t)
	stop, _ := startRun(t,
		"--kubeconfig", kubeconfig(t),
		"--leader-election-namespace", ns,
		"--leader-election-id", "sharder-version",
		"--health-probe-bind-address", "127.0.0.1:"+strconv.Itoa(healthPort),
		"--metrics-bind-address", "0",
		"--webhook=false",
	)
	lease := &coordinationv1.Lease{}
	g.Eventually(func() (string, error) {
		err := env().Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "sharder-version"}, lease)
		return ptr.Deref(lease.Spec.HolderIdentity, ""), err
	}, 30*time.Second, 100*time.Millisecond).ShouldNot(BeEmpty(), "the leader election Lease is acquired")
	g.Expect(lease.Labels).To(HaveKeyWithValue(labelVersion, versionLabelValue(Version())))

	ours := func(report *VersionReport) *SharderVersion {
		for i, s := range report.Cluster.Sharders {
			if s.Lease == ns+"/sharder-version" {
				return &report.Cluster.Sharders[i]
			}
		}
		return nil
	}
	out, err := runVersion(t, "--kubeconfig", kubeconfig(t), "-o", "json")
	g.Expect(err).NotTo(HaveOccurred(), out)
	s := ours(decodeVersion(g, out))
	g.Expect(s).NotTo(BeNil(), "found by its label among all namespaces' Leases:\n%s", out)
	g.Expect(s.Holder).To(HavePrefix(host + "_"))
	g.Expect(s.Version).To(Equal(Version()))
	g.Expect(s.Pod).To(Equal(host))
	g.Expect(s.Image).To(Equal("example.dev/sharder:9.9.9"), "the container named sharder")
	g.Expect(s.RenewTime).NotTo(BeNil())
	g.Expect(s.Note).To(BeEmpty())

	out, err = runVersion(t, "--kubeconfig", kubeconfig(t), "--lease", ns+"/sharder-version")
	g.Expect(err).NotTo(HaveOccurred(), out)
	g.Expect(out).To(MatchRegexp(`(?m)^LEASE\s+LEADER POD\s+VERSION\s+IMAGE\s+RENEWED\s+NOTE$`))
	g.Expect(out).To(MatchRegexp(`(?m)^` + ns + `/sharder-version\s+` + host + `\s+\S+\s+example\.dev/sharder:9\.9\.9\s+\S+ ago\s*$`))

	// Stopped, the sharder releases the Lease: nobody leads.
	g.Expect(stop()).To(Succeed())
	out, err = runVersion(t, "--kubeconfig", kubeconfig(t), "--lease", ns+"/sharder-version", "-o", "json")
	g.Expect(err).NotTo(HaveOccurred(), out)
	s = ours(decodeVersion(g, out))
	g.Expect(s).NotTo(BeNil(), out)
	g.Expect(s.Holder).To(BeEmpty())
	g.Expect(s.Pod).To(BeEmpty())
	g.Expect(s.Note).To(ContainSubstring("no replica leads"))
}

// TestVersionOfAnOlderSharder: a Lease without the version label, named
// with --lease, is reported with its leader's pod image and a note; without
// --lease nothing finds it and the command says how to name it.
func TestVersionOfAnOlderSharder(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := env().Namespace(t)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "sharder-5d8f9-x2x4q"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "example.dev/sharder:0.1.0"}}},
	}
	g.Expect(env().Client.Create(ctx, pod)).To(Succeed())
	now := metav1.NewMicroTime(time.Now())
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "old-sharder"},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity: ptr.To("sharder-5d8f9-x2x4q_3e1f5c2a-8d4b-4c1e-9f2a-6b7c8d9e0f1a"),
			AcquireTime:    &now, RenewTime: &now, LeaseDurationSeconds: ptr.To[int32](15),
		},
	}
	g.Expect(env().Client.Create(ctx, lease)).To(Succeed())

	out, err := runVersion(t, "--kubeconfig", kubeconfig(t), "--lease", ns+"/old-sharder", "-o", "json")
	g.Expect(err).NotTo(HaveOccurred(), out)
	report := decodeVersion(g, out)
	g.Expect(report.Cluster.Sharders).To(HaveLen(1))
	s := report.Cluster.Sharders[0]
	g.Expect(s.Version).To(BeEmpty())
	g.Expect(s.Pod).To(Equal("sharder-5d8f9-x2x4q"))
	g.Expect(s.Image).To(Equal("example.dev/sharder:0.1.0"), "the only container")
	g.Expect(s.Note).To(ContainSubstring("carries no " + labelVersion + " label"))

	out, err = runVersion(t, "--kubeconfig", kubeconfig(t), "--lease", ns+"/missing")
	g.Expect(err).NotTo(HaveOccurred(), out)
	g.Expect(out).To(MatchRegexp(`(?m)^In the cluster: not read: reading Lease ` + ns + `/missing: .*not found`))
}

func TestVersionLabelValue(t *testing.T) {
	for v, want := range map[string]string{
		"v0.4.0": "v0.4.0",
		"dev":    "dev",
		"v0.4.1-0.20261126181500-7911edd0c1a2+dirty": "v0.4.1-0.20261126181500-7911edd0c1a2_dirty",
		"v2.0.0+incompatible":                        "v2.0.0_incompatible",
		"-weird":                                     "",
		"v0.4.0/x":                                   "",
	} {
		if got := versionLabelValue(v); got != want {
			t.Errorf("versionLabelValue(%q) = %q, want %q", v, got, want)
		}
	}
}
