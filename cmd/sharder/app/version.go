package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// version is set at build time with -ldflags "-X .../app.version=...".
var version = "dev"

// labelVersion on the sharder's leader-election Lease is the version of the
// replica that last acquired or renewed it (versionLabelValue). `sharder
// version` finds the sharders that run in a cluster by it.
const labelVersion = "sharder.dev/version"

// Version returns the sharder's version string.
func Version() string {
	if version != "dev" {
		return version
	}
	if info, ok := debug.ReadBuildInfo(); ok && info.Main.Version != "" && info.Main.Version != "(devel)" {
		return info.Main.Version
	}
	return version
}

// versionLabelValue returns v as a label value: a semantic version's build
// metadata separator "+", which labels do not allow, becomes "_"; a value
// that is still no label value becomes "" (version unknown).
func versionLabelValue(v string) string {
	v = strings.ReplaceAll(v, "+", "_")
	if len(validation.IsValidLabelValue(v)) > 0 {
		return ""
	}
	return v
}

// versionOptions are the flags of `sharder version`.
type versionOptions struct {
	cluster clusterFlags
	output  outputFormat
	// client skips the cluster.
	client bool
	// lease names the leader-election Lease to read (NAMESPACE/NAME),
	// instead of finding them by their version label.
	lease string
	// timeout bounds the cluster reads.
	timeout time.Duration
}

// NewVersionCommand returns `sharder version`.
func NewVersionCommand() *cobra.Command {
	o := &versionOptions{}
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the sharder's version, and the version of the sharders that run in the cluster",
		Long: `Print the version of this command, then the sharders that run in the cluster:
for every leader-election Lease of a sharder, the replica that leads, the
version it wrote on the Lease (label ` + labelVersion + `, rewritten with every
renewal) and the image of the leader's pod (the pod named by the host part of
the Lease's holder, in the Lease's namespace).

Sharders are found by the label on their Lease, in all namespaces. A sharder
from before the label, or a Lease that cannot be listed in all namespaces, is
read with --lease NAMESPACE/NAME (the chart names the Lease after the release,
config/default names it sharder). A sharder without leader election has no
Lease and is not shown.

Without a cluster (no kubeconfig, an API server that does not answer within
--timeout) the command prints its own version and says why the cluster was not
read; it fails only on a wrong flag. --client reads no cluster.`,
		Example: `  sharder version
  sharder version --client
  sharder version --lease sharder-system/sharder -o json`,
		Args: cobra.NoArgs,
		PreRunE: func(*cobra.Command, []string) error {
			if o.lease == "" {
				return nil
			}
			if ns, name, ok := strings.Cut(o.lease, "/"); !ok || ns == "" || name == "" || strings.Contains(name, "/") {
				return fmt.Errorf("--lease %q: must be NAMESPACE/NAME", o.lease)
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd.Context(), cmd.OutOrStdout())
		},
	}
	o.cluster.addFlags(cmd.Flags())
	addOutputFlag(cmd, &o.output)
	cmd.Flags().BoolVar(&o.client, "client", false, "Print this command's version only; read no cluster.")
	cmd.Flags().StringVar(&o.lease, "lease", "", "The leader-election Lease of the sharder to read, as NAMESPACE/NAME, instead of every Lease labelled "+labelVersion+".")
	cmd.Flags().DurationVar(&o.timeout, "timeout", 10*time.Second, "Give up reading the cluster after this long.")
	return cmd
}

// VersionReport is the output of `sharder version`.
type VersionReport struct {
	// Client is this command's version.
	Client ClientVersion `json:"client"`
	// Cluster is what runs in the cluster; absent with --client.
	Cluster *ClusterVersion `json:"cluster,omitempty"`
}

// ClientVersion is the version of a sharder binary.
type ClientVersion struct {
	Version   string `json:"version"`
	GoVersion string `json:"goVersion"`
	Platform  string `json:"platform"`
}

// ClusterVersion lists the sharders that run in a cluster.
type ClusterVersion struct {
	// Sharders has one entry per leader-election Lease, sorted by
	// namespace and name.
	Sharders []SharderVersion `json:"sharders"`
	// Note says why the cluster was not read, or where no sharder was
	// found.
	Note string `json:"note,omitempty"`
}

// SharderVersion is the sharder that holds one leader-election Lease.
type SharderVersion struct {
	// Lease is the Lease, NAMESPACE/NAME.
	Lease string `json:"lease"`
	// Holder is the Lease's holder identity, empty when no replica leads.
	Holder string `json:"holder,omitempty"`
	// RenewTime is the Lease's last renewal.
	RenewTime *metav1.MicroTime `json:"renewTime,omitempty"`
	// Version is the version the replica that last wrote the Lease put in
	// its label (empty: a sharder from before the label, or a version that
	// is no label value).
	Version string `json:"version,omitempty"`
	// Pod is the leader's pod: the holder identity's host part, in the
	// Lease's namespace. Image is the image of its sharder container and
	// ImageID the image the kubelet runs for it (a digest).
	Pod     string `json:"pod,omitempty"`
	Image   string `json:"image,omitempty"`
	ImageID string `json:"imageID,omitempty"`
	// Note explains what could not be read.
	Note string `json:"note,omitempty"`
}

func (o *versionOptions) run(ctx context.Context, out io.Writer) error {
	report := &VersionReport{Client: ClientVersion{
		Version: Version(), GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH,
	}}
	if !o.client {
		ctx, cancel := context.WithTimeout(ctx, o.timeout)
		defer cancel()
		report.Cluster = o.clusterVersion(ctx)
	}
	if o.output.structured() {
		return writeStructured(out, o.output, report)
	}
	return writeVersionTable(out, report)
}

// clusterVersion reads the sharders' leader-election Leases and their
// leaders' pods. What it cannot read becomes a note: the command's own
// version is printed whatever the cluster says.
func (o *versionOptions) clusterVersion(ctx context.Context) *ClusterVersion {
	cv := &ClusterVersion{Sharders: []SharderVersion{}}
	cfg, err := o.cluster.restConfig()
	if err != nil {
		cv.Note = "not read: " + err.Error()
		return cv
	}
	c, err := client.New(cfg, client.Options{Scheme: newScheme()})
	if err != nil {
		cv.Note = "not read: creating client: " + err.Error()
		return cv
	}
	var leases []coordinationv1.Lease
	if o.lease != "" {
		ns, name, _ := strings.Cut(o.lease, "/")
		lease := &coordinationv1.Lease{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, lease); err != nil {
			cv.Note = fmt.Sprintf("not read: reading Lease %s: %v", o.lease, err)
			return cv
		}
		leases = append(leases, *lease)
	} else {
		list := &coordinationv1.LeaseList{}
		if err := c.List(ctx, list, client.HasLabels{labelVersion}); err != nil {
			cv.Note = fmt.Sprintf("not read: listing Leases labelled %s in all namespaces: %v (name the sharder's Lease with --lease NAMESPACE/NAME)", labelVersion, err)
			return cv
		}
		leases = list.Items
	}
	if len(leases) == 0 {
		cv.Note = "no sharder found: no Lease is labelled " + labelVersion + ". A sharder from before the label is read with " +
			"--lease NAMESPACE/NAME; one without leader election has no Lease"
		return cv
	}
	for i := range leases {
		cv.Sharders = append(cv.Sharders, leaderVersion(ctx, c, &leases[i]))
	}
	slices.SortFunc(cv.Sharders, func(a, b SharderVersion) int { return strings.Compare(a.Lease, b.Lease) })
	return cv
}

// leaderVersion returns what lease says of its sharder, and the image of
// its holder's pod.
func leaderVersion(ctx context.Context, c client.Client, lease *coordinationv1.Lease) SharderVersion {
	s := SharderVersion{
		Lease:     lease.Namespace + "/" + lease.Name,
		Holder:    ptr.Deref(lease.Spec.HolderIdentity, ""),
		RenewTime: lease.Spec.RenewTime,
		// "_" stands for the "+" a label cannot hold (versionLabelValue);
		// semantic versions have no "_" of their own.
		Version: strings.ReplaceAll(lease.Labels[labelVersion], "_", "+"),
	}
	if _, labelled := lease.Labels[labelVersion]; !labelled {
		s.Note = "the Lease carries no " + labelVersion + " label: its sharder predates it"
	}
	if s.Holder == "" {
		s.Note = joinNotes(s.Note, "no replica leads: the Lease is released")
		return s
	}
	// The identity is the replica's host name, a pod's name, then "_" and
	// a UUID (leaderIdentity).
	host, _, ok := cutLast(s.Holder, "_")
	if !ok || host == "" {
		s.Note = joinNotes(s.Note, "the holder names no pod")
		return s
	}
	s.Pod = host
	pod := &corev1.Pod{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: lease.Namespace, Name: host}, pod); err != nil {
		if apierrors.IsNotFound(err) {
			s.Note = joinNotes(s.Note, fmt.Sprintf("no pod %s in namespace %s: the leader runs elsewhere", host, lease.Namespace))
		} else {
			s.Note = joinNotes(s.Note, fmt.Sprintf("reading pod %s/%s: %v", lease.Namespace, host, err))
		}
		return s
	}
	s.Image, s.ImageID = sharderImage(pod)
	return s
}

// sharderImage returns the image of pod's container named sharder (the
// chart's and config/default's), else of its first container, and the image
// ID its status reports.
func sharderImage(pod *corev1.Pod) (image, imageID string) {
	if len(pod.Spec.Containers) == 0 {
		return "", ""
	}
	container := pod.Spec.Containers[0]
	for _, ctr := range pod.Spec.Containers {
		if ctr.Name == "sharder" {
			container = ctr
		}
	}
	for _, st := range pod.Status.ContainerStatuses {
		if st.Name == container.Name {
			imageID = st.ImageID
		}
	}
	return container.Image, imageID
}

// cutLast is strings.Cut around the last sep.
func cutLast(s, sep string) (before, after string, found bool) {
	if i := strings.LastIndex(s, sep); i >= 0 {
		return s[:i], s[i+len(sep):], true
	}
	return s, "", false
}

// writeVersionTable prints the command's version on the first line, as
// before the cluster was read, then a table of the sharders in the cluster.
func writeVersionTable(out io.Writer, report *VersionReport) error {
	c := report.Client
	if _, err := fmt.Fprintf(out, "sharder %s (%s, %s)\n", c.Version, c.GoVersion, c.Platform); err != nil {
		return err
	}
	cv := report.Cluster
	if cv == nil {
		return nil
	}
	if len(cv.Sharders) == 0 {
		_, err := fmt.Fprintf(out, "In the cluster: %s\n", oneLine(cv.Note))
		return err
	}
	now := time.Now()
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	_, err := fmt.Fprintf(tw, "\nLEASE\tLEADER POD\tVERSION\tIMAGE\tRENEWED\tNOTE\n")
	errs := []error{err}
	for _, s := range cv.Sharders {
		v := s.Version
		if v == "" {
			v = "unknown"
		}
		_, err := fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", s.Lease, orDash(s.Pod), v, orDash(s.Image), renewed(s.RenewTime, now), oneLine(s.Note))
		errs = append(errs, err)
	}
	return errors.Join(append(errs, tw.Flush())...)
}
