package instance_test

import (
	"context"
	"fmt"
	"os"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/sharder-dev/sharder/pkg/instance"
	"github.com/sharder-dev/sharder/pkg/instance/leaseholder"
)

// ConfigMapReconciler is an ordinary controller that knows nothing of rings,
// apart from labelling the Secrets it creates with their owner's instance.
type ConfigMapReconciler struct {
	client.Client
	Instance *instance.Instance
}

func (r *ConfigMapReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	cm := &corev1.ConfigMap{}
	if err := r.Get(ctx, req.NamespacedName, cm); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: cm.Namespace, Name: cm.Name}}
	if err := controllerutil.SetControllerReference(cm, secret, r.Scheme()); err != nil {
		return reconcile.Result{}, err
	}
	// The child belongs to the owner's instance from its creation on.
	r.Instance.LabelChild(cm, secret)
	if err := r.Create(ctx, secret); err != nil && !apierrors.IsAlreadyExists(err) {
		return reconcile.Result{}, err
	}
	return reconcile.Result{}, nil
}

// Example makes a controller of ConfigMaps (owning Secrets) an instance of
// the ring "configmaps", whose Leases live in the namespace
// "example-system". The same main serves a ring of either assignment unit:
// NewCache reads the ring and makes the cache its unit needs.
func Example() {
	opts := instance.Options{Ring: "configmaps", Lease: leaseholder.Options{Namespace: "example-system"}}

	// 1. The cache holds only this instance's ConfigMaps and Secrets: those
	// carrying its shard label (unit Objects), or those of the slots it
	// holds, changing as the sharder moves slots (unit Slots).
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		NewCache: instance.NewCache(opts, &corev1.ConfigMap{}, &corev1.Secret{}),
	})
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}

	// 2. The instance holds its Lease in the ring's Lease namespace.
	inst, err := instance.Setup(mgr, opts)
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	inst.AddNotifier(instance.NotifierFuncs{
		DrainedFunc: func(obj client.Object) { fmt.Println("handed over", obj.GetName()) },
	})

	// 3. The reconciler acknowledges drains (unit Objects), skips objects of
	// others, and LabelChild gives each Secret its ConfigMap's label.
	r, err := inst.Wrap(&corev1.ConfigMap{}, &ConfigMapReconciler{Client: mgr.GetClient(), Instance: inst})
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	if err := ctrl.NewControllerManagedBy(mgr).For(&corev1.ConfigMap{}).Owns(&corev1.Secret{}).Complete(r); err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
}
