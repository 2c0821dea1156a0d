// Command plaincontroller is a controller that knows nothing of sharder
// beyond a label selector on its cache: the kind of controller `sharder
// agent` is for. The end-to-end suite runs it beside an agent.
//
// It reconciles the ConfigMaps of one namespace that match --selector. A
// reconcile takes as long as the object's e2e.sharder.dev/reconcile-duration
// annotation says (default: no time), and it finishes that work even when
// the process is asked to stop, as a reconcile midway through a multi-step
// change would. With --reconcile-log, each reconcile's start and end are
// appended to that file as JSON lines (internal/reconcilelog, the format the
// suites' overlap checker reads). /healthz answers on
// --health-probe-bind-address until the last reconcile has ended
// (controller-runtime stops its probe server last).
//
// In a pod it needs no kubeconfig, and its name defaults to $POD_NAME:
// e2e/plaincontroller/config runs it as a StatefulSet with the agent as a
// native sidecar, and `make images` packs it as
// ghcr.io/sharder-dev/plaincontroller.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/sharder-dev/sharder/internal/reconcilelog"
)

// DurationAnnotation on a ConfigMap says how long its reconcile takes.
const DurationAnnotation = "e2e.sharder.dev/reconcile-duration"

type options struct {
	kubeconfig  string
	namespace   string
	selector    string
	name        string
	healthProbe string
	logPath     string
}

func main() {
	o := options{}
	// A flag set of its own: controller-runtime registers --kubeconfig on
	// the global one.
	fs := flag.NewFlagSet("plaincontroller", flag.ExitOnError)
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "Path to a kubeconfig. Default: the pod's service account.")
	fs.StringVar(&o.namespace, "namespace", "", "Namespace of the ConfigMaps. Required.")
	fs.StringVar(&o.selector, "selector", "", "Label selector of the cache. Required.")
	fs.StringVar(&o.name, "name", os.Getenv("POD_NAME"), "Name written into the reconcile log. Default: $POD_NAME.")
	fs.StringVar(&o.healthProbe, "health-probe-bind-address", ":8081", "Address of /healthz.")
	fs.StringVar(&o.logPath, "reconcile-log", "", "File the reconcile records are appended to. Default: none.")
	_ = fs.Parse(os.Args[1:])
	ctrl.SetLogger(zap.New())
	if err := run(ctrl.SetupSignalHandler(), o); err != nil {
		ctrl.Log.Error(err, "Exiting")
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) error {
	if o.namespace == "" || o.selector == "" || o.name == "" || o.healthProbe == "" {
		return errors.New("--namespace, --selector, --name (or $POD_NAME) and --health-probe-bind-address are required")
	}
	selector, err := labels.Parse(o.selector)
	if err != nil {
		return fmt.Errorf("--selector: %w", err)
	}
	var cfg *rest.Config
	if o.kubeconfig == "" {
		cfg, err = rest.InClusterConfig()
	} else {
		cfg, err = clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	}
	if err != nil {
		return fmt.Errorf("loading kubeconfig: %w", err)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Cache: cache.Options{
			DefaultNamespaces: map[string]cache.Config{o.namespace: {}},
			ByObject:          map[client.Object]cache.ByObject{&corev1.ConfigMap{}: {Label: selector}},
		},
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: o.healthProbe,
	})
	if err != nil {
		return fmt.Errorf("creating manager: %w", err)
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	var r reconcile.Reconciler = &reconciler{client: mgr.GetClient()}
	if o.logPath != "" {
		log, err := reconcilelog.Open(o.logPath, o.name, nil)
		if err != nil {
			return err
		}
		defer log.Close()
		r = log.Wrap(r)
	}
	if err := ctrl.NewControllerManagedBy(mgr).For(&corev1.ConfigMap{}).Complete(r); err != nil {
		return err
	}
	return mgr.Start(ctx)
}

type reconciler struct {
	client client.Client
}

func (r *reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	cm := &corev1.ConfigMap{}
	if err := r.client.Get(ctx, req.NamespacedName, cm); err != nil {
		if apierrors.IsNotFound(err) {
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, err
	}
	if v, ok := cm.Annotations[DurationAnnotation]; ok {
		d, err := time.ParseDuration(v)
		if err != nil {
			return reconcile.Result{}, reconcile.TerminalError(fmt.Errorf("annotation %s: %w", DurationAnnotation, err))
		}
		// Not cut short by ctx: the work in flight is finished.
		time.Sleep(d)
	}
	return reconcile.Result{}, nil
}
