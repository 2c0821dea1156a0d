#!/usr/bin/env bash
# generate.sh CONTROLLER_GEN: deepcopy code, CRD manifests and RBAC from the
# +kubebuilder markers.
set -euo pipefail
cg=$1
cd "$(dirname "$0")/.."
"$cg" object paths=./pkg/apis/...
"$cg" crd paths=./pkg/apis/... output:crd:artifacts:config=config/crd/bases
# Only the sharder's own packages: pkg/instance runs inside controllers, not in the sharder.
"$cg" rbac:roleName=sharder paths=./pkg/sharder/... paths=./pkg/drain/... paths=./cmd/... output:rbac:artifacts:config=config/rbac
if [ -d examples/etcd-operator/api ]; then
  "$cg" object paths=./examples/etcd-operator/api/...
  "$cg" crd paths=./examples/etcd-operator/api/... output:crd:artifacts:config=examples/etcd-operator/config/crd
fi
if [ -d examples/etcd-operator/internal ]; then
  "$cg" rbac:roleName=etcd-operator paths=./examples/etcd-operator/... output:rbac:artifacts:config=examples/etcd-operator/config/rbac
fi
