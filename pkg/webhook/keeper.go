package webhook

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
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
	"github.com/sharder-dev/sharder/pkg/webhook/internal/pki"
)

// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=validatingwebhookconfigurations,verbs=get;list;watch;create;update;delete
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=clusterroles,verbs=get

// keeper keeps the ValidatingWebhookConfiguration in line with the rings.
// It runs on the leader only: the configuration lives in the API server, so
// admission goes on while leadership moves, and replicas of different
// versions (during a rolling update) never take turns rewriting it. Every
// write is computed from the rings and the CA bundle alone, so a newly
// elected leader converges without knowing what the last one did.
type keeper struct {
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
func (k *keeper) ownerReferences(ctx context.Context) ([]metav1.OwnerReference, error) {
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

// Reconcile writes the configuration the rings call for, or deletes it when
// there is no ring.
func (k *keeper) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	log := logf.FromContext(ctx).WithValues("configuration", k.opts.ConfigurationName)
	rings := &v1alpha1.ControllerRingList{}
	if err := k.client.List(ctx, rings); err != nil {
		return reconcile.Result{}, fmt.Errorf("listing ControllerRings: %w", err)
	}
	current := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	err := k.client.Get(ctx, types.NamespacedName{Name: k.opts.ConfigurationName}, current)
	exists := err == nil
	if err != nil && !apierrors.IsNotFound(err) {
		return reconcile.Result{}, fmt.Errorf("reading ValidatingWebhookConfiguration %s: %w", k.opts.ConfigurationName, err)
	}
	active := make([]v1alpha1.ControllerRing, 0, len(rings.Items))
	for _, r := range rings.Items {
		if r.DeletionTimestamp.IsZero() {
			active = append(active, r)
		}
	}

	if len(active) == 0 {
		if exists && current.Labels[labelManagedBy] == managedBy {
			if err := k.client.Delete(ctx, current, client.Preconditions{UID: &current.UID}); err != nil && !apierrors.IsNotFound(err) {
				return reconcile.Result{}, fmt.Errorf("deleting ValidatingWebhookConfiguration %s: %w", current.Name, err)
			}
			log.Info("Deleted the webhook configuration: no ring left")
		}
		return reconcile.Result{}, nil
	}

	id, err := k.identity.get(ctx)
	if err != nil {
		return reconcile.Result{}, err
	}
	p := configParams{
		name:       k.opts.ConfigurationName,
		identity:   id,
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
		if k.opts.CertMode == CertModeExternal {
			requeue.RequeueAfter = k.opts.ResyncPeriod // files change without events
		}
	}
	desired := buildConfiguration(active, p)
	if desired.OwnerReferences, err = k.ownerReferences(ctx); err != nil {
		return reconcile.Result{}, err
	}
	if k.opts.OwnerClusterRole != "" && desired.OwnerReferences == nil && requeue.RequeueAfter == 0 {
		requeue.RequeueAfter = k.opts.ResyncPeriod // the owner may come later
	}

	if !exists {
		if err := k.client.Create(ctx, desired); err != nil {
			return reconcile.Result{}, fmt.Errorf("creating ValidatingWebhookConfiguration %s: %w", desired.Name, err)
		}
		log.Info("Created the webhook configuration", "webhooks", len(desired.Webhooks))
		return requeue, nil
	}
	if p.injectFrom != "" {
		// cert-manager owns the bundle: keep what it injected.
		var injected []byte
		for _, w := range current.Webhooks {
			if len(w.ClientConfig.CABundle) > 0 {
				injected = w.ClientConfig.CABundle
			}
		}
		for i := range desired.Webhooks {
			desired.Webhooks[i].ClientConfig.CABundle = injected
		}
	}
	if equality.Semantic.DeepEqual(current.Webhooks, desired.Webhooks) &&
		equality.Semantic.DeepEqual(current.OwnerReferences, desired.OwnerReferences) &&
		current.Labels[labelManagedBy] == managedBy &&
		current.Annotations[annotationInjectCA] == k.opts.CAInjectFrom {
		return requeue, nil
	}
	updated := current.DeepCopy()
	updated.Webhooks = desired.Webhooks
	updated.OwnerReferences = desired.OwnerReferences
	if updated.Labels == nil {
		updated.Labels = map[string]string{}
	}
	updated.Labels[labelManagedBy] = managedBy
	if k.opts.CAInjectFrom != "" {
		if updated.Annotations == nil {
			updated.Annotations = map[string]string{}
		}
		updated.Annotations[annotationInjectCA] = k.opts.CAInjectFrom
	} else {
		delete(updated.Annotations, annotationInjectCA)
	}
	if err := k.client.Update(ctx, updated); err != nil {
		return reconcile.Result{}, fmt.Errorf("updating ValidatingWebhookConfiguration %s: %w", updated.Name, err)
	}
	log.Info("Updated the webhook configuration", "webhooks", len(desired.Webhooks))
	return requeue, nil
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
