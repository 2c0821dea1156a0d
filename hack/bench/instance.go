package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/sharder-dev/sharder/pkg/instance"
	"github.com/sharder-dev/sharder/pkg/instance/leaseholder"
)

// instanceCommand is the first argument that runs this program as a
// simulated instance.
const instanceCommand = "instance"

// runInstance runs a simulated instance: it holds its Lease through the
// instance library and acknowledges drains of its ConfigMaps at once. Its
// reconciler does nothing, so a drain is acknowledged as soon as the
// instance sees it.
func runInstance(args []string) error {
	fs := flag.NewFlagSet(instanceCommand, flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the instance's identity")
	ringName := fs.String("ring", "", "ring name")
	leaseNamespace := fs.String("lease-namespace", "", "namespace of the instance Leases")
	id := fs.String("id", "", "instance ID")
	leaseDuration := fs.Duration("lease-duration", 5*time.Second, "Lease duration")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *kubeconfig == "" || *ringName == "" || *leaseNamespace == "" || *id == "" {
		return errors.New("--kubeconfig, --ring, --lease-namespace and --id are required")
	}
	ctrl.SetLogger(zap.New())
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = 500, 1000
	instOpts := instance.Options{
		Ring: *ringName, Identity: *id,
		Lease: leaseholder.Options{
			Namespace:     *leaseNamespace,
			LeaseDuration: *leaseDuration,
			RenewPeriod:   *leaseDuration / 5,
		},
	}
	mgr, err := ctrl.NewManager(cfg, manager.Options{
		NewCache:               instance.NewCache(instOpts, &corev1.ConfigMap{}),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		return err
	}
	inst, err := instance.Setup(mgr, instOpts)
	if err != nil {
		return err
	}
	r, err := inst.Wrap(&corev1.ConfigMap{}, reconcile.Func(func(context.Context, reconcile.Request) (reconcile.Result, error) {
		return reconcile.Result{}, nil
	}))
	if err != nil {
		return err
	}
	if err := ctrl.NewControllerManagedBy(mgr).Named("bench").For(&corev1.ConfigMap{}).
		WithOptions(controllerOptions()).Complete(r); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "instance %s of ring %s starting\n", *id, *ringName)
	return mgr.Start(ctrl.SetupSignalHandler())
}

func controllerOptions() controller.Options {
	return controller.Options{MaxConcurrentReconciles: 8}
}
