// Package controller reconciles EtcdClusters: for each cluster it keeps a
// ConfigMap of etcd settings, a headless peer Service, a client Service, a
// StatefulSet of members and a PodDisruptionBudget, all controlled by the
// cluster, and reports the cluster's phase, conditions and members in its
// status. It changes the cluster's etcd membership one member at a time
// (members.go): learners added before their pods start and promoted once
// caught up, members removed before their pods go and never below quorum,
// members that lost their data replaced, and outdated members restarted
// one at a time. With spec.security it also keeps the cluster's CA,
// certificates and root password as Secrets (certs.go, security.go), renews
// the certificates before they expire, and turns etcd's authentication on.
//
// Entry points: NewReconciler and (*Reconciler).SetupWithManager.
//
// The reconciler is written to run as one instance of a sharded operator: it
// reads only through the manager's cache (which a sharded instance restricts
// to its own objects), labels every child it creates through
// Options.LabelChild so the child lands in the same instance's cache, and
// never relies on an object it cannot see. It works unchanged when the
// operator is not sharded.
//
// Phases (status.phase):
//
//	"" ──▶ Creating ──(all members ready)──▶ Running
//	          │                               │  ▲
//	          │ (object rejected              │  │ (quorum ready again)
//	          │  or conflicting)   (quorum    ▼  │
//	          └──────────────────▶ Failed ◀───lost)
//	                                 │
//	                                 └─(objects fixed)──▶ Creating or Running
//
// Running is Scaling while members are added or removed and Upgrading while
// members restart on a new version; both lose and regain the quorum as
// Running does. Deleting once the cluster is deleted, until its children are gone and
// the finalizer is removed. A Failed cluster is retried every
// Options.RecoveryInterval and on every change of its children, so it leaves
// Failed on its own once the cause is gone.
//
// No kubelet is needed for the reconciler to be correct: a cluster stays
// Creating until its StatefulSet reports every replica ready.
//
// Beside it, NewBackupReconciler streams etcd snapshots of the cluster an
// EtcdBackup names into an S3-compatible bucket, once or on a cron schedule
// with retention, and NewRestoreReconciler creates the new cluster of an
// EtcdRestore, whose members restore the backup's snapshot in an init
// container (AnnotationRestoreSource, package memberrestore). Backups and
// restores are assigned on their own, not with their cluster: they read the
// cluster, its pods and Secrets through BackupOptions.APIReader and
// RestoreOptions.APIReader.
package controller
