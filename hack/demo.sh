#!/usr/bin/env bash
# demo.sh: brings up the local control plane and prints how to reach it.
# Stops it and cleans up on Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=bin/demo
mkdir -p "$dir"
kubeconfig=$PWD/$dir/kubeconfig
go build -o "$dir/local-control-plane" ./hack/local-control-plane
"$dir/local-control-plane" --kubeconfig "$kubeconfig" --crds config/crd/bases &
cp=$!
trap 'kill -TERM $cp 2>/dev/null; wait $cp 2>/dev/null || true' EXIT INT TERM
until [ -s "$kubeconfig" ] && "$KUBEBUILDER_ASSETS/kubectl" --kubeconfig "$kubeconfig" get --raw /readyz >/dev/null 2>&1; do
  kill -0 $cp 2>/dev/null || { echo "control plane failed to start" >&2; exit 1; }
  sleep 0.5
done
echo
echo "The local control plane is up. In another shell:"
echo "  export KUBECONFIG=$kubeconfig PATH=$KUBEBUILDER_ASSETS:\$PATH"
echo "  kubectl get namespaces"
echo "Press Ctrl-C to stop it."
wait $cp
