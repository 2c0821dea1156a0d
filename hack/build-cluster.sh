#!/usr/bin/env bash
# build-cluster.sh DIR CONTAINERD_VERSION: builds what the local one-node
# cluster runs besides the control plane into DIR: kubelet,
# kube-controller-manager, kube-scheduler and kube-proxy from the versions
# pinned in hack/tools/go.mod, and containerd, its runc shim and ctr at
# CONTAINERD_VERSION. Does nothing when DIR already holds them all (the folder
# name carries the versions).
set -euo pipefail
# hack/tools is a module of its own, no part of the workspace (go.work).
export GOWORK=off
dir=$(mkdir -p "$1" && cd "$1" && pwd) containerd_version=$2
k8s=(kubelet kube-controller-manager kube-scheduler kube-proxy)
containerd=(containerd containerd-shim-runc-v2 ctr)
missing=0
for b in "${k8s[@]}" "${containerd[@]}"; do
  [ -x "$dir/$b" ] || missing=1
done
[ "$missing" = 0 ] && exit 0

tools=$(cd "$(dirname "$0")/tools" && pwd)
mkdir -p "$dir"
tmp=$(mktemp -d "$dir/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' INT TERM
# Most packages are shared with the control plane's build, so after it this is
# mostly compiling the node's own packages and linking.
echo "building the local cluster's node binaries into $dir (minutes on a cold cache)"
export GOFLAGS=-buildvcs=false
cd "$tools"
k8s_version=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
minor=$(echo "$k8s_version" | cut -d. -f2)
v=k8s.io/component-base/version
ldflags="-s -w -X $v.gitVersion=$k8s_version -X $v.gitMajor=1 -X $v.gitMinor=$minor -X $v.gitTreeState=clean"
for b in "${k8s[@]}"; do
  go build -ldflags "$ldflags" -o "$tmp/$b" "k8s.io/kubernetes/cmd/$b"
done
# containerd is its own module; go install pins it (and its go.sum) by version.
# Static, as upstream releases it: cgo would want headers this machine lacks.
for b in "${containerd[@]}"; do
  GOBIN="$tmp" CGO_ENABLED=0 go install -ldflags "-s -w" "github.com/containerd/containerd/v2/cmd/$b@$containerd_version"
done
for b in "${k8s[@]}" "${containerd[@]}"; do
  mv "$tmp/$b" "$dir/"
done
