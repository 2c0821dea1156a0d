#!/usr/bin/env bash
# go-install.sh NAME PACKAGE VERSION: installs PACKAGE@VERSION as bin/NAME-VERSION
# and points bin/NAME at it. A second run with the same version does nothing.
set -euo pipefail
name=$1 pkg=$2 version=$3
bin=$(cd "$(dirname "$0")/.." && pwd)/bin
target="$bin/$name-$version"
if [ ! -x "$target" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  echo "installing $pkg@$version"
  GOWORK=off GOBIN="$tmp" GOFLAGS=-buildvcs=false go install "$pkg@$version"
  mkdir -p "$bin"
  mv "$tmp"/* "$target"
fi
ln -sf "$name-$version" "$bin/$name"
