#!/usr/bin/env bash
# build-control-plane.sh DIR: builds etcd, kube-apiserver and kubectl from the
# versions pinned in hack/tools/go.mod into DIR. Does nothing when DIR already
# holds all three (the folder name carries the versions).
set -euo pipefail
dir=$1
if [ -x "$dir/etcd" ] && [ -x "$dir/kube-apiserver" ] && [ -x "$dir/kubectl" ]; then
  exit 0
fi
tools=$(cd "$(dirname "$0")/tools" && pwd)
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
go build -ldflags "$ldflags" -o "$tmp/kubectl" k8s.io/kubernetes/cmd/kubectl
go build -ldflags "-s -w" -o "$tmp/etcd" ./cmd/etcd
mv "$tmp/kube-apiserver" "$tmp/kubectl" "$tmp/etcd" "$dir/"
