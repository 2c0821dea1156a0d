package main

import (
	"fmt"
	"os"

	"go.uber.org/zap"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	etcdv1alpha1 "github.com/sharder-dev/sharder/examples/etcd-operator/api/v1alpha1"
	"github.com/sharder-dev/sharder/examples/etcd-operator/internal/controller"
	"github.com/sharder-dev/sharder/examples/etcd-operator/internal/memberrestore"
	"github.com/sharder-dev/sharder/internal/reconcilelog"
	"github.com/sharder-dev/sharder/pkg/instance"
)

// setupBackupAndRestore registers the EtcdBackup and EtcdRestore
// controllers. Backups and restores are main resources of the ring, each
// assigned on its own, so each is wrapped with the instance's drain
// acknowledgement for its kind.
func setupBackupAndRestore(mgr ctrl.Manager, inst *instance.Instance, rlog *reconcilelog.Log, o *options) error {
	wrapFor := func(proto client.Object) func(reconcile.Reconciler) (reconcile.Reconciler, error) {
		return func(next reconcile.Reconciler) (reconcile.Reconciler, error) {
			if rlog != nil {
				next = rlog.Wrap(next)
			}
			return inst.Wrap(proto, next)
		}
	}
	backups := controller.NewBackupReconciler(mgr.GetClient(), mgr.GetScheme(), mgr.GetEventRecorder("etcd-operator"), controller.BackupOptions{
		APIReader:   mgr.GetAPIReader(),
		EtcdTimeout: o.etcdTimeout,
		Wrap:        wrapFor(&etcdv1alpha1.EtcdBackup{}),
	})
	if err := backups.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the backup controller: %w", err)
	}
	restores := controller.NewRestoreReconciler(mgr.GetClient(), mgr.GetScheme(), mgr.GetEventRecorder("etcd-operator"), controller.RestoreOptions{
		Image:     o.restoreImage,
		APIReader: mgr.GetAPIReader(),
		Wrap:      wrapFor(&etcdv1alpha1.EtcdRestore{}),
	})
	if err := restores.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the restore controller: %w", err)
	}
	return nil
}

// restoreMember runs the restore-member subcommand: the init container of a
// restored cluster's members. Its settings come from the environment (see
// memberrestore.FromEnv); args must be empty. It returns the exit code.
func restoreMember(args []string) int {
	lg, err := zap.NewProduction()
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcd-operator restore-member:", err)
		return 1
	}
	defer func() { _ = lg.Sync() }()
	if len(args) > 0 {
		lg.Error("Unexpected arguments: settings come from the environment", zap.Strings("args", args))
		return 2
	}
	cfg, err := memberrestore.FromEnv(os.Getenv)
	if err != nil {
		lg.Error("Reading the environment", zap.Error(err))
		return 2
	}
	if _, err := memberrestore.Run(ctrl.SetupSignalHandler(), cfg, lg); err != nil {
		lg.Error("Restoring the member", zap.Error(err))
		return 1
	}
	return 0
}
