package app

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/transport"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
)

type statusOptions struct {
	cluster clusterFlags
	output  outputFormat
	recount bool
	// drains and unassigned list the objects behind those counts.
	drains, unassigned bool
	now                func() time.Time
	// wrap, when set, wraps the transport of every request (tests count
	// requests with it).
	wrap transport.WrapperFunc
}

// NewStatusCommand returns `sharder status`.
func NewStatusCommand() *cobra.Command {
	o := &statusOptions{now: time.Now}
	cmd := &cobra.Command{
		Use:   "status [RING]",
		Short: "Show rings, instances, objects per instance and drains in flight",
		Long: `Show one ring, or every ring: its instances with their state and weight, the
objects assigned to each instance, the drains in flight and the objects nobody
holds.

By default the command shows each ring's status as the sharder last wrote it
(one read per ring) with its instances' Leases (one list per ring): it never
lists the rings' objects, so it is cheap on any cluster. The status is only as
fresh as the sharder keeps it; the command says when it may be stale (no status
yet, a spec change not yet observed, an instance called ready whose Lease has
long expired), which usually means the sharder is not running.

With --recount the command counts everything itself from the objects' labels
and the Leases, whether or not the sharder runs: it lists the metadata of every
object of the rings' resources, and adds per instance its controlled objects,
its drains, and the instances objects are labelled with that have no Lease.

--drains lists each drain in flight: the main object, the instance holding it
(none once a forced move released it), the instance the drain hands it to, and
how long ago the drain label was last written, as the API server recorded it in
the object's managedFields. The drain's timeout counts from when the leading
sharder saw the drain begin, which only its memory holds: a drain older than
the ring's drainTimeout is forced once the leader's own count ends.

--unassigned lists the main objects without a shard label, and the controlled
objects without one whose controller is of the ring's resources. Both list only
the objects concerned, with a label selector, in the rings' namespaces.`,
		Example: `  sharder status
  sharder status etcd-operator
  sharder status etcd-operator --recount
  sharder status etcd-operator --drains --unassigned
  sharder status etcd-operator -o json`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.run(cmd.Context(), cmd.OutOrStdout(), args)
		},
		ValidArgsFunction: func(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
			if len(args) > 0 {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			return o.ringNames(cmd.Context()), cobra.ShellCompDirectiveNoFileComp
		},
	}
	o.cluster.addFlags(cmd.Flags())
	addOutputFlag(cmd, &o.output)
	cmd.Flags().BoolVar(&o.recount, "recount", false,
		"Count objects from their labels instead of reading the rings' status. Lists the metadata of every object of the rings' resources.")
	cmd.Flags().BoolVar(&o.drains, "drains", false,
		"List the drains in flight: each main object carrying the drain label, its instance, its target and since when the label is written. Lists the objects carrying the drain label.")
	cmd.Flags().BoolVar(&o.unassigned, "unassigned", false,
		"List the objects of the rings' resources without a shard label. Lists the objects without it.")
	return cmd
}

// clients returns a typed client (rings, Leases, namespaces) and a metadata
// client (the rings' resources).
func (o *statusOptions) clients() (client.Client, metadata.Interface, error) {
	cfg, err := o.cluster.restConfig()
	if err != nil {
		return nil, nil, err
	}
	if o.wrap != nil {
		cfg.Wrap(o.wrap)
	}
	c, err := client.New(cfg, client.Options{Scheme: newScheme()})
	if err != nil {
		return nil, nil, fmt.Errorf("creating client: %w", err)
	}
	m, err := metadata.NewForConfig(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("creating metadata client: %w", err)
	}
	return c, m, nil
}

func (o *statusOptions) ringNames(ctx context.Context) []string {
	c, _, err := o.clients()
	if err != nil {
		return nil
	}
	rings := &v1alpha1.ControllerRingList{}
	if err := c.List(ctx, rings); err != nil {
		return nil
	}
	names := make([]string, 0, len(rings.Items))
	for _, r := range rings.Items {
		names = append(names, r.Name)
	}
	return names
}

func (o *statusOptions) run(ctx context.Context, out io.Writer, args []string) error {
	c, m, err := o.clients()
	if err != nil {
		return err
	}
	var rings []v1alpha1.ControllerRing
	if len(args) == 1 {
		ring := &v1alpha1.ControllerRing{}
		if err := c.Get(ctx, client.ObjectKey{Name: args[0]}, ring); err != nil {
			if apierrors.IsNotFound(err) {
				return fmt.Errorf("ControllerRing %q not found (list them with: kubectl get controllerrings)", args[0])
			}
			return fmt.Errorf("reading ControllerRing %s: %w", args[0], err)
		}
		rings = append(rings, *ring)
	} else {
		list := &v1alpha1.ControllerRingList{}
		if err := c.List(ctx, list); err != nil {
			return fmt.Errorf("listing ControllerRings: %w", err)
		}
		rings = list.Items
	}
	var report *StatusReport
	if o.recount {
		report, err = recountStatus(ctx, c, m, rings, o.now())
	} else {
		report, err = readStatus(ctx, c, rings, o.now())
	}
	if err != nil {
		return err
	}
	if o.drains || o.unassigned {
		if err := listRingObjects(ctx, c, m, rings, report, o.drains, o.unassigned); err != nil {
			return err
		}
	}
	return writeStatus(out, o.output, report)
}
