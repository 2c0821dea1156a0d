#!/usr/bin/env bash
# busybox.sh OUT ARCH: puts the statically linked busybox of the Debian
# package busybox-static for ARCH (a Go/Debian architecture name: amd64,
# arm64) at OUT, and the package's version at OUT.version: the shell
# controller's image is busybox, kubectl and a script (make images). Does
# nothing when OUT is there already. Needs apt-get and dpkg-deb (Debian,
# Ubuntu); as root, or with sudo without a password, it updates the package
# lists first.
set -euo pipefail
out=$1
arch=$2
if [ -x "$out" ]; then
  exit 0
fi
for tool in apt-get dpkg-deb; do
  if ! command -v "$tool" >/dev/null; then
    echo "busybox.sh: $tool not found: the shell controller's image takes busybox from Debian's busybox-static package" >&2
    exit 1
  fi
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# apt-get downloads as the user _apt where it can.
chmod 755 "$tmp"
if [ "$(id -u)" = 0 ]; then
  apt-get update -qq
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  sudo -n apt-get update -qq
fi
(cd "$tmp" && apt-get download -q "busybox-static:$arch")
deb=$(ls "$tmp"/busybox-static_*.deb)
dpkg-deb -x "$deb" "$tmp/root"
mkdir -p "$(dirname "$out")"
cp "$tmp/root/bin/busybox" "$out.tmp"
dpkg-deb -f "$deb" Version >"$out.version"
mv "$out.tmp" "$out"
echo "$out: busybox-static $(cat "$out.version") ($arch)"
