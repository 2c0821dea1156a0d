package app

import (
	"context"
	"fmt"
	"io"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sharder-dev/sharder/pkg/sharder/webhook"
)

// removeAssignWebhook removes the ring's assigning webhook (admission mode)
// from the MutatingWebhookConfiguration, and the configuration when no
// webhook is left, so that new objects stop being labelled for the ring.
func (o *uninstallOptions) removeAssignWebhook(ctx context.Context, out io.Writer, c client.Client, ringName string) error {
	const kind = "MutatingWebhookConfiguration"
	cfg := &admissionregistrationv1.MutatingWebhookConfiguration{}
	if err := c.Get(ctx, types.NamespacedName{Name: o.configurationName}, cfg); err != nil {
		if apierrors.IsNotFound(err) {
			o.step(out, UninstallStep{Kind: kind, Name: o.configurationName, Result: "not found"})
			return nil
		}
		return fmt.Errorf("reading %s %s: %w", kind, o.configurationName, err)
	}
	name := webhook.AssignWebhookName(ringName)
	kept := cfg.Webhooks[:0:0]
	for _, w := range cfg.Webhooks {
		if w.Name != name {
			kept = append(kept, w)
		}
	}
	switch {
	case len(kept) == len(cfg.Webhooks):
		o.step(out, UninstallStep{Kind: kind, Name: o.configurationName, Result: "no webhook of ring " + ringName})
	case len(kept) == 0:
		if !o.dryRun {
			if err := c.Delete(ctx, cfg, client.Preconditions{UID: &cfg.UID, ResourceVersion: &cfg.ResourceVersion}); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("deleting %s %s: %w", kind, o.configurationName, err)
			}
		}
		o.step(out, UninstallStep{Kind: kind, Name: o.configurationName, Result: o.would("deleted", "would be deleted") + " (no other ring in admission mode)"})
	default:
		cfg.Webhooks = kept
		if !o.dryRun {
			if err := c.Update(ctx, cfg); err != nil {
				return fmt.Errorf("removing the webhook of ring %s from %s %s: %w", ringName, kind, o.configurationName, err)
			}
		}
		o.step(out, UninstallStep{Kind: kind, Name: o.configurationName, Result: "webhook of ring " + ringName + " " + o.would("removed", "would be removed")})
	}
	return nil
}
