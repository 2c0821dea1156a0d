package webhook

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/sharder/config"
	"github.com/sharder-dev/sharder/pkg/sharder/webhook/internal/pki"
)

// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=validatingwebhookconfigurations;mutatingwebhookconfigurations,verbs=get;list;watch;create;update;delete
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=clusterroles,verbs=get

// configWriter keeps the ValidatingWebhookConfiguration, and the
// MutatingWebhookConfiguration of the rings in admission mode, in line with
// the rings.
// It runs on the leader only: the configuration lives in the API server, so
// admission goes on while leadership moves, and replicas of different
// versions (during a rolling update) never take turns rewriting it. Every
// write is computed from the rings and the CA bundle alone, so a newly
// elected leader converges without knowing what the last one did.
type configWriter struct {
	client   client.Client // cached reads, direct writes
	opts     Options
	identity *identity
	// caBundle returns the CA bundle to write; nil (with no error) means
	// not known yet.
	caBundle func() ([]byte, error)
	// owners reads Options.OwnerClusterRole (uncached).
	owners client.Reader
}

// ownerReferences returns the configuration's owner: the ClusterRole named
// by Options.OwnerClusterRole, none while it does not exist.
func (k *configWriter) ownerReferences(ctx context.Context) ([]metav1.OwnerReference, error) {
	if k.opts.OwnerClusterRole == "" {
		return nil, nil
	}
	role := &rbacv1.ClusterRole{}
	err := k.owners.Get(ctx, types.NamespacedName{Name: k.opts.OwnerClusterRole}, role)
	if apierrors.IsNotFound(err) {
		logf.FromContext(ctx).Info("The owner ClusterRole of the webhook configuration does not exist; writing it without an owner",
			"clusterRole", k.opts.OwnerClusterRole)
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading ClusterRole %s, the webhook configuration's owner: %w", k.opts.OwnerClusterRole, err)
	}
	return []metav1.OwnerReference{{
		APIVersion: rbacv1.SchemeGroupVersion.String(), Kind: "ClusterRole", Name: role.Name, UID: role.UID,
	}}, nil
}

// Reconcile writes the configurations the rings call for, or deletes them
// when there is no ring (the mutating one: no ring in admission mode).
func (k *configWriter) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	log := logf.FromContext(ctx).WithValues("configuration", k.opts.ConfigurationName)
	rings := &v1alpha1.ControllerRingList{}
	if err := k.client.List(ctx, rings); err != nil {
		return reconcile.Result{}, fmt.Errorf("listing ControllerRings: %w", err)
	}
	active := make([]v1alpha1.ControllerRing, 0, len(rings.Items))
	for _, r := range rings.Items {
		if r.DeletionTimestamp.IsZero() {
			active = append(active, r)
		}
	}

	if len(active) == 0 {
		if err := k.deleteManaged(ctx, "ValidatingWebhookConfiguration", &admissionregistrationv1.ValidatingWebhookConfiguration{}); err != nil {
			return reconcile.Result{}, err
		}
		return reconcile.Result{}, k.deleteManaged(ctx, "MutatingWebhookConfiguration", &admissionregistrationv1.MutatingWebhookConfiguration{})
	}

	id, err := k.identity.get(ctx)
	if err != nil {
		return reconcile.Result{}, err
	}
	p := configParams{
		name:       k.opts.ConfigurationName,
		identity:   id,
		fenced:     k.opts.LeaderLease.Name != "",
		injectFrom: k.opts.CAInjectFrom,
		timeout:    k.opts.TimeoutSeconds,
		url:        k.opts.URL,
		service: admissionregistrationv1.ServiceReference{
			Namespace: k.opts.ServiceNamespace, Name: k.opts.ServiceName, Port: &k.opts.ServicePort,
		},
	}
	requeue := reconcile.Result{}
	if p.injectFrom == "" {
		if p.caBundle, err = k.caBundle(); err != nil {
			return reconcile.Result{}, err
		}
		if p.caBundle == nil {
			// The certificate is not loaded yet; its load triggers us again.
			log.Info("Waiting for the webhook CA bundle")
			return reconcile.Result{RequeueAfter: 5 * time.Second}, nil
		}
		if k.opts.CertMode == config.CertModeExternal {
			requeue.RequeueAfter = k.opts.ResyncPeriod // files change without events
		}
	}
	owners, err := k.ownerReferences(ctx)
	if err != nil {
		return reconcile.Result{}, err
	}
	if k.opts.OwnerClusterRole != "" && owners == nil && requeue.RequeueAfter == 0 {
		requeue.RequeueAfter = k.opts.ResyncPeriod // the owner may come later
	}
	if err := k.writeValidating(ctx, active, p, owners); err != nil {
		return reconcile.Result{}, err
	}
	if err := k.writeMutating(ctx, active, p, owners); err != nil {
		return reconcile.Result{}, err
	}
	return requeue, nil
}

// deleteManaged deletes the configuration named Options.ConfigurationName
// of obj's kind if the sharder manages it.
func (k *configWriter) deleteManaged(ctx context.Context, kind string, obj client.Object) error {
	err := k.client.Get(ctx, types.NamespacedName{Name: k.opts.ConfigurationName}, obj)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading %s %s: %w", kind, k.opts.ConfigurationName, err)
	}
	if obj.GetLabels()[labelManagedBy] != managedBy {
		return nil
	}
	uid := obj.GetUID()
	if err := k.client.Delete(ctx, obj, client.Preconditions{UID: &uid}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting %s %s: %w", kind, k.opts.ConfigurationName, err)
	}
	logf.FromContext(ctx).Info("Deleted the webhook configuration: no ring needs it", "kind", kind, "configuration", k.opts.ConfigurationName)
	return nil
}

// keepMeta sets the sharder's label, the CA injection annotation and the
// owners on cfg; it reports whether any of them changed.
func (k *configWriter) keepMeta(cfg client.Object, owners []metav1.OwnerReference) bool {
	changed := !equality.Semantic.DeepEqual(cfg.GetOwnerReferences(), owners) ||
		cfg.GetLabels()[labelManagedBy] != managedBy || cfg.GetAnnotations()[annotationInjectCA] != k.opts.CAInjectFrom
	cfg.SetOwnerReferences(owners)
	labels := cfg.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels[labelManagedBy] = managedBy
	cfg.SetLabels(labels)
	annotations := cfg.GetAnnotations()
	if k.opts.CAInjectFrom != "" {
		if annotations == nil {
			annotations = map[string]string{}
		}
		annotations[annotationInjectCA] = k.opts.CAInjectFrom
	} else {
		delete(annotations, annotationInjectCA)
	}
	cfg.SetAnnotations(annotations)
	return changed
}

// writeValidating writes the ValidatingWebhookConfiguration of the rings.
func (k *configWriter) writeValidating(ctx context.Context, active []v1alpha1.ControllerRing, p configParams, owners []metav1.OwnerReference) error {
	desired := buildConfiguration(active, p)
	return writeConfiguration(ctx, k, desired, &admissionregistrationv1.ValidatingWebhookConfiguration{},
		func(c *admissionregistrationv1.ValidatingWebhookConfiguration) *[]admissionregistrationv1.ValidatingWebhook {
			return &c.Webhooks
		},
		func(w *admissionregistrationv1.ValidatingWebhook) *admissionregistrationv1.WebhookClientConfig {
			return &w.ClientConfig
		},
		p, owners)
}

// writeConfiguration creates desired, or updates the configuration of its
// name (read into current, empty) to it, for a validating or a mutating
// configuration: webhooksOf gives a configuration's webhooks, clientConfigOf
// a webhook's client configuration. With cert-manager injecting the CA
// bundle, the bundle it injected is kept.
func writeConfiguration[C client.Object, W any](ctx context.Context, k *configWriter, desired, current C,
	webhooksOf func(C) *[]W, clientConfigOf func(*W) *admissionregistrationv1.WebhookClientConfig,
	p configParams, owners []metav1.OwnerReference) error {
	kind := strings.TrimPrefix(fmt.Sprintf("%T", current), "*v1.")
	webhooks := webhooksOf(desired)
	log := logf.FromContext(ctx).WithValues("configuration", k.opts.ConfigurationName, "kind", kind)
	desired.SetOwnerReferences(owners)
	err := k.client.Get(ctx, types.NamespacedName{Name: k.opts.ConfigurationName}, current)
	if apierrors.IsNotFound(err) {
		if err := k.client.Create(ctx, desired); err != nil {
			return fmt.Errorf("creating %s %s: %w", kind, desired.GetName(), err)
		}
		log.Info("Created the webhook configuration", "webhooks", len(*webhooks))
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading %s %s: %w", kind, k.opts.ConfigurationName, err)
	}
	if p.injectFrom != "" {
		// cert-manager owns the bundle: keep what it injected.
		var injected []byte
		for i := range *webhooksOf(current) {
			if bundle := clientConfigOf(&(*webhooksOf(current))[i]).CABundle; len(bundle) > 0 {
				injected = bundle
			}
		}
		for i := range *webhooks {
			clientConfigOf(&(*webhooks)[i]).CABundle = injected
		}
	}
	updated, ok := current.DeepCopyObject().(C)
	if !ok {
		return fmt.Errorf("copying %s %s", kind, current.GetName())
	}
	metaChanged := k.keepMeta(updated, owners)
	if !metaChanged && equality.Semantic.DeepEqual(*webhooksOf(current), *webhooks) {
		return nil
	}
	*webhooksOf(updated) = *webhooks
	if err := k.client.Update(ctx, updated); err != nil {
		return fmt.Errorf("updating %s %s: %w", kind, updated.GetName(), err)
	}
	log.Info("Updated the webhook configuration", "webhooks", len(*webhooks))
	return nil
}

// fileCABundle reads the CA bundle of external mode from dir/ca.crt.
func fileCABundle(dir string) func() ([]byte, error) {
	return func() ([]byte, error) {
		path := filepath.Join(dir, pki.KeyCABundle)
		b, err := os.ReadFile(path)
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("CA bundle %s not found: mount the certificate Secret with its ca.crt, or set the cert-manager CA injection", path)
		}
		if err != nil {
			return nil, fmt.Errorf("reading the CA bundle: %w", err)
		}
		if len(pki.ParseBundle(b)) == 0 {
			return nil, fmt.Errorf("CA bundle %s holds no CA certificate", path)
		}
		return b, nil
	}
}
