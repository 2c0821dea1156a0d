package webhook

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/sharder-dev/sharder/pkg/apis/sharder/v1alpha1"
	"github.com/sharder-dev/sharder/pkg/sharder/config"
)

// Setup adds the webhook to mgr:
//
//   - the admission handler, served under PathPrefix by the manager's
//     webhook server on every replica;
//   - in self-managed certificate mode, the certificate manager (every
//     replica), which makes the webhook server serve the certificate kept in
//     the Secret and adds the readiness check "webhook-certificate";
//   - the slot table handler, served under TablePathPrefix on every
//     replica, which checks the sharder's writes of the tables of rings of
//     unit Slots against the Leases of the instances that lose slots;
//   - the assigning handler, served under AssignPathPrefix on every
//     replica, which labels the new objects of rings in admission mode;
//   - the configuration writer (leader only), which writes the
//     ValidatingWebhookConfiguration and, while a ring is in admission
//     mode, the MutatingWebhookConfiguration of the same name.
//
// The manager's scheme must hold ControllerRing, and its cache should be
// built with leasecontroller.CacheByObject() so that only ring Leases are cached.
// Self-managed mode needs controller-runtime's default webhook server
// (webhook.NewServer); external mode works with any.
func Setup(mgr ctrl.Manager, opts Options) error {
	if err := opts.setDefaults(); err != nil {
		return err
	}
	srv := mgr.GetWebhookServer()
	if srv == nil {
		return errors.New("the manager has no webhook server")
	}
	direct, err := client.New(mgr.GetConfig(), client.Options{Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper()})
	if err != nil {
		return fmt.Errorf("creating an uncached client: %w", err)
	}
	id := &identity{client: direct, name: opts.Identity}

	// Informers are registered now and started with the cache; the handler
	// checks they have synced instead of waiting for them.
	ctx := context.Background()
	ringInformer, err := mgr.GetCache().GetInformer(ctx, &v1alpha1.ControllerRing{}, cache.BlockUntilSynced(false))
	if err != nil {
		return fmt.Errorf("getting the ControllerRing informer: %w", err)
	}
	leaseInformer, err := mgr.GetCache().GetInformer(ctx, &coordinationv1.Lease{}, cache.BlockUntilSynced(false))
	if err != nil {
		return fmt.Errorf("getting the Lease informer: %w", err)
	}

	h := &labelHandler{
		cache:     mgr.GetCache(),
		apiReader: mgr.GetAPIReader(),
		mapper:    mgr.GetRESTMapper(),
		synced:    func() bool { return ringInformer.HasSynced() && leaseInformer.HasSynced() },
		identity:  id,
		clock:     opts.Clock,
		builds: newRingBuilds(mgr.GetCache(), opts.Rings, opts.Clock, mgr.GetLogger().WithName("label-webhook").WithName("rings"),
			func() bool { return ringInformer.HasSynced() && leaseInformer.HasSynced() }),
	}
	if err := h.builds.addEventHandlers(ringInformer, leaseInformer); err != nil {
		return err
	}
	if err := mgr.Add(h.builds); err != nil {
		return fmt.Errorf("adding the ring builder: %w", err)
	}
	if opts.LeaderLease.Name != "" {
		w, err := newLeaderWatch(mgr.GetConfig(), opts.LeaderLease, opts.Clock)
		if err != nil {
			return err
		}
		if err := mgr.Add(w); err != nil {
			return fmt.Errorf("adding the leader Lease watch: %w", err)
		}
		h.leader = w.view.leader
		h.synced = func() bool { return ringInformer.HasSynced() && leaseInformer.HasSynced() && w.synced() }
	}

	// A deleted ring leaves no series behind.
	_, err = ringInformer.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			if r, ok := obj.(*v1alpha1.ControllerRing); ok {
				h.forget(r.Name)
			}
		},
	})
	if err != nil {
		return fmt.Errorf("watching ring deletions: %w", err)
	}

	// The configuration writer's reconciles all concern the one configuration.
	key := reconcile.Request{NamespacedName: types.NamespacedName{Name: opts.ConfigurationName}}
	bundleEvents := make(chan event.GenericEvent, 1)
	k := &configWriter{client: mgr.GetClient(), opts: opts, identity: id, owners: direct}

	switch opts.CertMode {
	case config.CertModeSelfManaged:
		def, ok := srv.(*ctrlwebhook.DefaultServer)
		if !ok {
			return fmt.Errorf("self-managed certificates need controller-runtime's default webhook server, not %T; use external certificates", srv)
		}
		certs := &certificates{
			client: direct,
			key:    types.NamespacedName{Namespace: opts.Namespace, Name: opts.SecretName},
			cfg:    opts.pkiConfig(),
			clock:  opts.Clock,
			resync: opts.ResyncPeriod,
			changed: func() {
				select {
				case bundleEvents <- event.GenericEvent{}:
				default: // a reconcile is already pending
				}
			},
		}
		def.Options.TLSOpts = append(def.Options.TLSOpts, func(c *tls.Config) { c.GetCertificate = certs.GetCertificate })
		if err := mgr.Add(certs); err != nil {
			return fmt.Errorf("adding the certificate manager: %w", err)
		}
		if err := mgr.AddReadyzCheck("webhook-certificate", certs.Check); err != nil {
			return fmt.Errorf("adding the readiness check: %w", err)
		}
		k.caBundle = func() ([]byte, error) { return certs.CABundle(), nil }
	case config.CertModeExternal:
		dir := opts.CertDir
		if def, ok := srv.(*ctrlwebhook.DefaultServer); ok && dir == "" {
			dir = def.Options.CertDir
		}
		k.caBundle = fileCABundle(dir)
	}

	log := mgr.GetLogger().WithName("label-webhook")
	srv.Register(PathPrefix, &admission.Webhook{
		Handler:         h,
		WithContextFunc: withPath,
		LogConstructor: func(_ logr.Logger, req *admission.Request) logr.Logger {
			return admission.DefaultLogConstructor(log, req)
		},
	})

	srv.Register(TablePathPrefix, &admission.Webhook{
		Handler:         &tableHandler{apiReader: mgr.GetAPIReader(), identity: id},
		WithContextFunc: withPath,
		LogConstructor: func(_ logr.Logger, req *admission.Request) logr.Logger {
			return admission.DefaultLogConstructor(log.WithName("slot-table"), req)
		},
	})

	srv.Register(AssignPathPrefix, &admission.Webhook{
		Handler:         &assignHandler{labels: h},
		WithContextFunc: withPath,
		LogConstructor: func(_ logr.Logger, req *admission.Request) logr.Logger {
			return admission.DefaultLogConstructor(log.WithName("assign"), req)
		},
	})

	toKey := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{key}
	})
	err = ctrl.NewControllerManagedBy(mgr).
		Named("webhook-configuration").
		WithOptions(controller.Options{
			MaxConcurrentReconciles: 1,
			NeedLeaderElection:      ptr.To(true),
		}).
		Watches(&v1alpha1.ControllerRing{}, toKey, builder.WithPredicates(ringSpecChanged)).
		Watches(&admissionregistrationv1.ValidatingWebhookConfiguration{}, toKey,
			builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool { return o.GetName() == opts.ConfigurationName }))).
		Watches(&admissionregistrationv1.MutatingWebhookConfiguration{}, toKey,
			builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool { return o.GetName() == opts.ConfigurationName }))).
		WatchesRawSource(source.Channel(bundleEvents, toKey)).
		Complete(k)
	if err != nil {
		return fmt.Errorf("adding the configuration writer: %w", err)
	}
	return nil
}

// ringSpecChanged passes every ring event but an update that leaves what the
// configurations are made of as it was: the ring's spec (its generation),
// its identity and its deletion. The assignment writes a ring's status up to
// once a second while objects move, and with 1,000 instances that status
// lists 1,000 members: rewriting the configurations after each would read
// (and copy) every ring for nothing.
var ringSpecChanged = predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
	return e.ObjectOld == nil || e.ObjectNew == nil || e.ObjectOld.GetUID() != e.ObjectNew.GetUID() ||
		e.ObjectOld.GetGeneration() != e.ObjectNew.GetGeneration() ||
		e.ObjectOld.GetDeletionTimestamp().IsZero() != e.ObjectNew.GetDeletionTimestamp().IsZero()
}}
