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

// Output formats of `sharder status`.
const (
	outputTable = "table"
	outputJSON  = "json"
	outputYAML  = "yaml"
)

type statusOptions struct {
	cluster clusterFlags
	output  string
	recount bool
	now     func() time.Time
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
its drains, and the instances objects are labelled with that have no Lease.`,
		Example: `  sharder status
  sharder status etcd-operator
  sharder status etcd-operator --recount
  sharder status etcd-operator -o json`,
		Args: cobra.MaximumNArgs(1),
		PreRunE: func(*cobra.Command, []string) error {
			switch o.output {
			case outputTable, outputJSON, outputYAML:
				return nil
			}
			return fmt.Errorf("--output %q: must be table, json or yaml", o.output)
		},
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
	cmd.Flags().StringVarP(&o.output, "output", "o", outputTable, "Output format: table, json or yaml.")
	cmd.Flags().BoolVar(&o.recount, "recount", false,
		"Count objects from their labels instead of reading the rings' status. Lists the metadata of every object of the rings' resources.")
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{outputTable, outputJSON, outputYAML}, cobra.ShellCompDirectiveNoFileComp))
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
	return writeStatus(out, o.output, report)
}
