package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/sharder/config"
)

// uninstallOptions are the flags of `sharder uninstall`.
type uninstallOptions struct {
	cluster           clusterFlags
	configurationName string
	resources         []string
	timeout           time.Duration
	// sharderWait is how long a deleted ring waits for a running sharder to
	// remove its labels under its finalizer before uninstall removes the
	// finalizer and the labels itself.
	sharderWait time.Duration
	// dryRun reads what uninstall would remove and changes nothing.
	dryRun bool
	output outputFormat

	// report collects the steps as they are taken.
	report UninstallReport
}

// Kinds of UninstallStep besides the API kinds of the objects removed.
const (
	kindVWC = "ValidatingWebhookConfiguration"
	// kindResource: the objects of a resource of the ring, whose labels
	// the step removes.
	kindResource = "Resource"
)

// UninstallReport is what `sharder uninstall` did, or would do with
// --dry-run, step by step in the order taken.
type UninstallReport struct {
	Ring   string          `json:"ring"`
	DryRun bool            `json:"dryRun"`
	Steps  []UninstallStep `json:"steps"`
}

// UninstallStep is one step of `sharder uninstall`.
type UninstallStep struct {
	// Kind is ControllerRing, ValidatingWebhookConfiguration,
	// MutatingWebhookConfiguration or Resource (the objects of one of the
	// ring's resources, whose labels the step removes).
	Kind string `json:"kind"`
	// Name is the object's name, or the resource as RESOURCE.GROUP.
	Name string `json:"name"`
	// Result says what the step did or, with --dry-run, would do.
	Result string `json:"result"`
	// Objects counts the objects whose labels the step removed, or would
	// remove (kind Resource only).
	Objects *int `json:"objects,omitempty"`
}

// step records s; in the table format it prints it at once, as a line of
// progress.
func (o *uninstallOptions) step(out io.Writer, s UninstallStep) {
	o.report.Steps = append(o.report.Steps, s)
	if o.output.structured() {
		return
	}
	if s.Kind == kindResource {
		fmt.Fprintf(out, "%s: %s\n", s.Name, s.Result)
		return
	}
	fmt.Fprintf(out, "%s %s: %s\n", s.Kind, s.Name, s.Result)
}

// NewUninstallCommand returns `sharder uninstall`.
func NewUninstallCommand() *cobra.Command {
	o := &uninstallOptions{}
	cmd := &cobra.Command{
		Use:   "uninstall RING",
		Short: "Remove a ring: its ControllerRing, its webhook entries and its labels on every object",
		Long: `Remove everything a ring left in the cluster, in this order:

 1. delete the ControllerRing and wait until it is gone, so that a running
    sharder stops assigning its objects (the ring's finalizer keeps it until
    the sharder removed its labels; when no sharder has done so within
    --sharder-wait, uninstall removes the finalizer and, in step 4, the
    labels itself);
 2. remove the ring's assigning webhook (admission mode) from the
    MutatingWebhookConfiguration of the same name (and the configuration
    itself when no webhook is left), so that new objects stop being labelled;
 3. remove the ring's two webhooks from the ValidatingWebhookConfiguration
    (and the configuration itself when no webhook is left): with failure
    policy Fail and no sharder to answer, they would reject every later
    change to the ring's labels;
 4. remove the ring's shard, drain and slot labels from every object of the ring's
    resources, in all namespaces.

The ring's resources are read from the ControllerRing, or, when it is gone
already, from its webhook entries, or else from --resource. Instances select
their objects by the shard label: once it is removed they see none, so stop
them first. Running it again finishes what an interrupted run left.

With --dry-run it reads the same and prints what it would remove, counting
the labelled objects, and changes nothing.

The table format prints each step as it is taken; -o json and -o yaml print
all the steps at the end, also when a step failed (the error follows on
standard error).`,
		Example: `  sharder uninstall etcd-operator
  sharder uninstall etcd-operator --dry-run
  sharder uninstall etcd-operator --dry-run -o json
  sharder uninstall etcd-operator --resource etcdclusters.etcd.example.sharder.dev --resource statefulsets.apps`,
		Args: cobra.ExactArgs(1),
		PreRunE: func(_ *cobra.Command, args []string) error {
			if errs := validation.IsDNS1123Label(args[0]); len(errs) > 0 {
				return fmt.Errorf("ring name %q: %s", args[0], strings.Join(errs, "; "))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), o.timeout)
			defer cancel()
			o.report = UninstallReport{Ring: args[0], DryRun: o.dryRun, Steps: []UninstallStep{}}
			err := o.run(ctx, cmd.OutOrStdout(), args[0])
			if o.output.structured() {
				err = errors.Join(err, writeStructured(cmd.OutOrStdout(), o.output, &o.report))
			}
			return err
		},
	}
	o.cluster.addFlags(cmd.Flags())
	cmd.Flags().StringVar(&o.configurationName, "webhook-configuration-name", config.DefaultWebhookConfigurationName,
		"Name of the ValidatingWebhookConfiguration (and MutatingWebhookConfiguration) the sharder keeps (webhook.configurationName).")
	cmd.Flags().StringSliceVar(&o.resources, "resource", nil,
		"A resource of the ring (RESOURCE.GROUP, or RESOURCE for the core group), when neither the ControllerRing nor its webhooks are left to name them. Repeatable.")
	cmd.Flags().DurationVar(&o.timeout, "timeout", 10*time.Minute, "Give up after this long.")
	cmd.Flags().DurationVar(&o.sharderWait, "sharder-wait", time.Minute,
		"How long the deleted ControllerRing waits for a running sharder to remove its labels (its finalizer "+v1alpha1.FinalizerLabels+") before uninstall removes the finalizer and the labels itself.")
	cmd.Flags().BoolVar(&o.dryRun, "dry-run", false, "Print what would be removed (the ring, its webhook entries, the number of labelled objects per resource) and change nothing.")
	addOutputFlag(cmd, &o.output)
	return cmd
}

func (o *uninstallOptions) run(ctx context.Context, out io.Writer, ringName string) error {
	cfg, err := o.cluster.restConfig()
	if err != nil {
		return err
	}
	c, err := client.New(cfg, client.Options{Scheme: newScheme()})
	if err != nil {
		return fmt.Errorf("creating client: %w", err)
	}
	m, err := metadata.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("creating metadata client: %w", err)
	}

	resources, err := o.deleteRing(ctx, out, c, ringName)
	if err != nil {
		return err
	}
	if err := o.removeAssignWebhook(ctx, out, c, ringName); err != nil {
		return err
	}
	fromWebhooks, err := o.removeWebhooks(ctx, out, c, ringName)
	if err != nil {
		return err
	}
	if resources == nil {
		resources = fromWebhooks
	}
	for _, r := range o.resources {
		resources = append(resources, schema.ParseGroupResource(r))
	}
	if len(resources) == 0 {
		return fmt.Errorf("found neither ControllerRing %q nor webhooks of it in ValidatingWebhookConfiguration %s, "+
			"so nothing tells which resources carry its labels: name them with --resource", ringName, o.configurationName)
	}
	resources = unique(resources)
	return o.removeLabels(ctx, out, c, m, ringName, resources)
}

// would returns what a dry run prints instead of done.
func (o *uninstallOptions) would(done, wouldBe string) string {
	if o.dryRun {
		return wouldBe
	}
	return done
}

// deleteRing deletes the ControllerRing and waits until it is gone. It
// returns the ring's resources, nil when there was no ring.
func (o *uninstallOptions) deleteRing(ctx context.Context, out io.Writer, c client.Client, ringName string) ([]schema.GroupResource, error) {
	ring := &v1alpha1.ControllerRing{}
	if err := c.Get(ctx, types.NamespacedName{Name: ringName}, ring); err != nil {
		if apierrors.IsNotFound(err) {
			o.step(out, UninstallStep{Kind: "ControllerRing", Name: ringName, Result: "not found"})
			return nil, nil
		}
		return nil, fmt.Errorf("reading ControllerRing %s: %w", ringName, err)
	}
	resources := append(ring.Spec.MainResources(), ring.Spec.ControlledResources()...)
	if o.dryRun {
		o.step(out, UninstallStep{Kind: "ControllerRing", Name: ringName, Result: "would be deleted"})
		return unique(resources), nil
	}
	if err := c.Delete(ctx, ring); err != nil && !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("deleting ControllerRing %s: %w", ringName, err)
	}
	deadline := time.Now().Add(o.sharderWait)
	err := wait.PollUntilContextCancel(ctx, 500*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		cur := &v1alpha1.ControllerRing{}
		err := c.Get(ctx, types.NamespacedName{Name: ringName}, cur)
		switch {
		case apierrors.IsNotFound(err):
			return true, nil
		case err != nil:
			return false, err
		case time.Now().Before(deadline):
			return false, nil
		}
		return false, o.removeFinalizer(ctx, out, c, cur)
	})
	if err != nil {
		return nil, fmt.Errorf("waiting for ControllerRing %s to be deleted: %w", ringName, err)
	}
	o.step(out, UninstallStep{Kind: "ControllerRing", Name: ringName, Result: "deleted"})
	return unique(resources), nil
}

// removeFinalizer removes the finalizer under which a sharder removes the
// ring's labels, once none did within --sharder-wait (no sharder runs, or
// it may not list or patch a resource): removeLabels does the same.
func (o *uninstallOptions) removeFinalizer(ctx context.Context, out io.Writer, c client.Client, ring *v1alpha1.ControllerRing) error {
	updated := ring.DeepCopy()
	if !controllerutil.RemoveFinalizer(updated, v1alpha1.FinalizerLabels) {
		return nil // another finalizer, not the sharder's
	}
	err := c.Patch(ctx, updated, client.MergeFromWithOptions(ring, client.MergeFromWithOptimisticLock{}))
	switch {
	case apierrors.IsConflict(err) || apierrors.IsNotFound(err):
		return nil // changed meanwhile: the next poll sees it
	case err != nil:
		return fmt.Errorf("removing finalizer %s: %w", v1alpha1.FinalizerLabels, err)
	}
	o.step(out, UninstallStep{Kind: "ControllerRing", Name: ring.Name, Result: fmt.Sprintf(
		"no sharder removed its labels within %s: finalizer %s removed, the labels are removed here", o.sharderWait, v1alpha1.FinalizerLabels)})
	return nil
}

// removeWebhooks removes the ring's webhooks from the configuration, and the
// configuration when no webhook is left. It returns the resources their
// rules name.
func (o *uninstallOptions) removeWebhooks(ctx context.Context, out io.Writer, c client.Client, ringName string) ([]schema.GroupResource, error) {
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	if err := c.Get(ctx, types.NamespacedName{Name: o.configurationName}, cfg); err != nil {
		if apierrors.IsNotFound(err) {
			o.step(out, UninstallStep{Kind: kindVWC, Name: o.configurationName, Result: "not found"})
			return nil, nil
		}
		return nil, fmt.Errorf("reading ValidatingWebhookConfiguration %s: %w", o.configurationName, err)
	}
	names := []string{ringName + ".shard-label.sharder.dev", ringName + ".drain-label.sharder.dev"}
	var resources []schema.GroupResource
	kept := cfg.Webhooks[:0:0]
	for _, w := range cfg.Webhooks {
		if !slices.Contains(names, w.Name) {
			kept = append(kept, w)
			continue
		}
		for _, rule := range w.Rules {
			for _, g := range rule.APIGroups {
				for _, r := range rule.Resources {
					if !strings.Contains(r, "/") {
						resources = append(resources, schema.GroupResource{Group: g, Resource: r})
					}
				}
			}
		}
	}
	switch {
	case len(kept) == len(cfg.Webhooks):
		o.step(out, UninstallStep{Kind: kindVWC, Name: o.configurationName, Result: "no webhooks of ring " + ringName})
		return nil, nil
	case len(kept) == 0:
		if !o.dryRun {
			if err := c.Delete(ctx, cfg, client.Preconditions{UID: &cfg.UID, ResourceVersion: &cfg.ResourceVersion}); err != nil && !apierrors.IsNotFound(err) {
				return nil, fmt.Errorf("deleting ValidatingWebhookConfiguration %s: %w", o.configurationName, err)
			}
		}
		o.step(out, UninstallStep{Kind: kindVWC, Name: o.configurationName, Result: o.would("deleted", "would be deleted") + " (no other ring)"})
	default:
		cfg.Webhooks = kept
		if !o.dryRun {
			if err := c.Update(ctx, cfg); err != nil {
				return nil, fmt.Errorf("removing the webhooks of ring %s from ValidatingWebhookConfiguration %s: %w", ringName, o.configurationName, err)
			}
		}
		o.step(out, UninstallStep{Kind: kindVWC, Name: o.configurationName, Result: "webhooks of ring " + ringName + " " + o.would("removed", "would be removed")})
	}
	return unique(resources), nil
}

// removeLabels removes the ring's shard, drain and slot labels, and its
// drain start annotation, from every object of resources that carries any of
// the labels. The slot label policy allows it: its binding goes with the
// ring, deleted before.
func (o *uninstallOptions) removeLabels(ctx context.Context, out io.Writer, c client.Client, m metadata.Interface, ringName string, resources []schema.GroupResource) error {
	shard, drain, slot := v1alpha1.ShardLabel(ringName), v1alpha1.DrainLabel(ringName), v1alpha1.SlotLabel(ringName)
	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:null},"labels":{%q:null,%q:null,%q:null}}}`,
		v1alpha1.DrainStartedAnnotation(ringName), shard, drain, slot)
	for _, gr := range resources {
		gvr, err := c.RESTMapper().ResourceFor(gr.WithVersion(""))
		if err != nil {
			return fmt.Errorf("resource %s: not served by the API server: %w", gr, err)
		}
		removed := 0
		labelled := map[types.NamespacedName]bool{} // a dry run counts an object with several labels once
		for _, label := range []string{shard, drain, slot} {
			var errs []error
			err := eachObject(ctx, c.RESTMapper(), m, gr, label, func(obj *metav1.PartialObjectMetadata) {
				if o.dryRun {
					key := types.NamespacedName{Namespace: obj.Namespace, Name: obj.Name}
					if !labelled[key] {
						labelled[key] = true
						removed++
					}
					return
				}
				// The API server loads the changed webhook configuration
				// asynchronously: a webhook just removed may still be called.
				err := retry.OnError(webhookGoneBackoff, isWebhookCallFailure, func() error {
					_, err := m.Resource(gvr).Namespace(obj.Namespace).Patch(ctx, obj.Name, types.MergePatchType, patch, metav1.PatchOptions{})
					return err
				})
				switch {
				case err == nil:
					removed++
				case !apierrors.IsNotFound(err):
					errs = append(errs, fmt.Errorf("removing the labels of ring %s from %s %s/%s: %w", ringName, gr, obj.Namespace, obj.Name, err))
				}
			})
			if err := errors.Join(append(errs, err)...); err != nil {
				return err
			}
		}
		o.step(out, UninstallStep{Kind: kindResource, Name: gr.String(), Objects: ptr.To(removed),
			Result: fmt.Sprintf("labels of ring %s %s %d objects", ringName, o.would("removed from", "would be removed from"), removed)})
	}
	return nil
}

// webhookGoneBackoff bounds the wait for the API server to stop calling a
// removed webhook (about 25 s in all).
var webhookGoneBackoff = wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Steps: 8}

func isWebhookCallFailure(err error) bool {
	return apierrors.IsInternalError(err) && strings.Contains(err.Error(), "failed calling webhook")
}

func unique(grs []schema.GroupResource) []schema.GroupResource {
	slices.SortFunc(grs, func(a, b schema.GroupResource) int { return strings.Compare(a.String(), b.String()) })
	return slices.Compact(grs)
}
