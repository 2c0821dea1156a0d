#!/usr/bin/env bash
# demo.sh: runs the sharder on a local control plane with three instances of
# the example etcd operator and a hundred EtcdClusters, adds a fourth
# instance, then keeps everything running for kubectl until Ctrl-C and
# cleans up (hack/demo/main.go does the work; --unit slots runs the ring in
# slot mode, --help lists the flags).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p bin/demo-driver
go build -o bin/demo-driver/demo ./hack/demo
exec bin/demo-driver/demo "$@"
