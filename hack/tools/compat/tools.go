//go:build tools

// Package tools records the Kubernetes command this module builds, so that go
// mod tidy keeps its dependencies: the kube-apiserver of the oldest supported
// minor. Its etcd and kubectl are the newest control plane's (hack/tools).
package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
