#!/usr/bin/env bash
# build-control-plane.sh DIR [MODULE SHARED]: builds etcd, kube-apiserver and
# kubectl from the versions pinned in hack/tools/go.mod into DIR. Does nothing
# when DIR already holds all three (the folder name carries the versions).
#
# With MODULE and SHARED, it builds only kube-apiserver, from the
# k8s.io/kubernetes version MODULE's go.mod pins, and links etcd and kubectl
# from the control plane in SHARED: the compatibility control plane
# (hack/tools/compat) puts an older API server behind the same etcd and
# kubectl, which are its storage and a client, not what it tests.
set -euo pipefail
# hack/tools is a module of its own, no part of the workspace (go.work).
export GOWORK=off
dir=$1
module=${2:-}
shared=${3:-}
if [ -x "$dir/etcd" ] && [ -x "$dir/kube-apiserver" ] && [ -x "$dir/kubectl" ]; then
  exit 0
fi
tools=$(cd "$(dirname "$0")/tools" && pwd)
if [ -n "$module" ]; then
  tools=$(cd "$module" && pwd)
  shared=$(cd "$shared" && pwd)
fi
mkdir -p "$dir"
tmp=$(mktemp -d "$dir/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cd "$tools"
echo "building the local control plane into $dir (a few minutes on a cold cache)"
export GOFLAGS=-buildvcs=false
# Stamp the Kubernetes version so the API server reports it (/version) instead of v0.0.0.
k8s_version=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
minor=$(echo "$k8s_version" | cut -d. -f2)
v=k8s.io/component-base/version
ldflags="-s -w -X $v.gitVersion=$k8s_version -X $v.gitMajor=1 -X $v.gitMinor=$minor -X $v.gitTreeState=clean"
go build -ldflags "$ldflags" -o "$tmp/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
if [ -n "$shared" ]; then
  ln -sf "$shared/etcd" "$tmp/etcd"
  ln -sf "$shared/kubectl" "$tmp/kubectl"
else
  go build -ldflags "$ldflags" -o "$tmp/kubectl" k8s.io/kubernetes/cmd/kubectl
  go build -ldflags "-s -w" -o "$tmp/etcd" ./cmd/etcd
fi
mv "$tmp/kube-apiserver" "$tmp/kubectl" "$tmp/etcd" "$dir/"
