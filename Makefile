# sharder: make help lists the targets.

SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec
.DEFAULT_GOAL := help

ROOT := $(abspath .)
BIN := $(ROOT)/bin
GO ?= go
export GOFLAGS ?= -buildvcs=false

# The Go modules of the workspace (go.work), the library's first: the library
# (pkg/, cmd/sharder, internal/) is the root module, whose go.mod requires
# only what its packages and their tests import; the example operator and the
# test and bench tooling (e2e/, hack/) are modules of their own. From the root,
# ./... names only the root module's packages: the targets name every
# module's (ALL_PACKAGES). The modules under hack/tools pin the binaries they
# build and are no part of the workspace: they run with GOWORK=off.
MODULES := . e2e examples/etcd-operator hack
ALL_PACKAGES := $(foreach m,$(MODULES),$(if $(filter .,$(m)),./...,./$(m)/...))

# Local control plane, built from Go modules (hack/tools/go.mod pins the same versions).
KUBERNETES_VERSION := v1.36.3
ETCD_VERSION := v3.6.8
CONTROL_PLANE := $(BIN)/k8s/$(KUBERNETES_VERSION)-etcd-$(ETCD_VERSION)
export KUBEBUILDER_ASSETS := $(CONTROL_PLANE)
KUBECTL := $(CONTROL_PLANE)/kubectl
# The oldest Kubernetes minor the sharder supports, at its latest patch:
# make test-compat runs the suites that need only an API server against its
# kube-apiserver (hack/tools/compat/go.mod pins the same version), behind the
# etcd and kubectl above. docs/versioning.md says why this minor.
COMPAT_KUBERNETES_VERSION := v1.30.14
COMPAT_CONTROL_PLANE := $(BIN)/k8s/$(COMPAT_KUBERNETES_VERSION)-etcd-$(ETCD_VERSION)
# The packages whose tests start an API server, less the end-to-end suites,
# the benchmarks and the example etcd operator, whose CRD compares versions
# with CEL's semver library (Kubernetes 1.33 or later): those of the root
# module (./... from the root), as the others are modules of their own.
COMPAT_PACKAGES ?= $$($(GO) list -f '{{.ImportPath}} {{join .TestImports " "}} {{join .XTestImports " "}}' ./... | awk '/internal\/testenv/ {print $$1}')
# The real one-node cluster (make cluster): the node's binaries, from the same
# tools module plus containerd, and its state folder (kubeconfig, logs).
CONTAINERD_VERSION := v2.3.7
NODE := $(BIN)/k8s/$(KUBERNETES_VERSION)-containerd-$(CONTAINERD_VERSION)
CLUSTER_DIR := $(BIN)/cluster

# Tools, pinned and installed into bin/.
CONTROLLER_GEN_VERSION := v0.21.0
GOLANGCI_LINT_VERSION := v2.15.0
HELM_VERSION := v3.22.0
GOTESTSUM_VERSION := v1.13.0
ACTIONLINT_VERSION := v1.7.12
CONTROLLER_GEN := $(BIN)/controller-gen-$(CONTROLLER_GEN_VERSION)
GOLANGCI_LINT := $(BIN)/golangci-lint-$(GOLANGCI_LINT_VERSION)
HELM := $(BIN)/helm-$(HELM_VERSION)
GOTESTSUM := $(BIN)/gotestsum-$(GOTESTSUM_VERSION)
# actionlint checks the GitHub Actions workflows (.github/workflows): make lint
# runs it, and so does a test (hack/dist).
ACTIONLINT := $(BIN)/actionlint-$(ACTIONLINT_VERSION)
# promtool, Prometheus's rule checker and rule test runner, for the chart's
# alert tests: built by its own module (hack/tools/promtool), whose go.mod pins
# this version of github.com/prometheus/prometheus, without the service
# discovery plugins, which promtool's rule commands do not use.
PROMETHEUS_VERSION := v0.316.0
PROMTOOL := $(BIN)/promtool-$(PROMETHEUS_VERSION)
# The Prometheus server of the same version, built by the same module with
# only its Kubernetes service discovery: the real-cluster suite scrapes the
# sharder with it and runs the chart's alerts and dashboard queries on the
# live series.
PROMETHEUS := $(BIN)/prometheus-$(PROMETHEUS_VERSION)
# The S3-compatible object store the example operator's backups are tested
# against, locally (a process) and in the cluster (an image).
VERSITYGW_VERSION := v1.8.0
VERSITYGW := $(BIN)/versitygw-$(VERSITYGW_VERSION)
# Distribution's OCI registry: the real-cluster suite pushes the images and
# the chart to it (make push, make chart-push) and installs from it, and the
# local cluster's containerd pulls from it (docs/real-cluster.md).
DISTRIBUTION_VERSION := v3.1.2
OCI_REGISTRY := $(BIN)/registry-$(DISTRIBUTION_VERSION)

VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)

# Images. IMAGE_TAG is the chart's appVersion: the chart, the kustomizations and
# the docs refer to these images by exactly these references (config/images_test.go).
IMAGE_TAG := 0.1.0
SHARDER_IMAGE := ghcr.io/sharder-dev/sharder:$(IMAGE_TAG)
OPERATOR_IMAGE := ghcr.io/sharder-dev/etcd-operator:$(IMAGE_TAG)
# The end-to-end suite's controller that knows nothing of sharder beyond a
# label selector, run beside `sharder agent` (e2e/plaincontroller/config).
PLAIN_CONTROLLER_IMAGE := ghcr.io/sharder-dev/plaincontroller:$(IMAGE_TAG)
# A controller in POSIX shell around kubectl, run beside the agent
# (examples/shell-controller): busybox (Debian's busybox-static, fetched with
# apt-get by hack/busybox.sh into bin/images/), a static kubectl and the script.
SHELL_CONTROLLER_IMAGE := ghcr.io/sharder-dev/shell-controller:$(IMAGE_TAG)
# For the local cluster: its sandbox image, and etcd under the example
# operator's default repository, so that EtcdClusters find it.
PAUSE_IMAGE := ghcr.io/sharder-dev/pause:1.0
ETCD_IMAGE := gcr.io/etcd-development/etcd:$(ETCD_VERSION)
# The previous etcd minor release, for the operator's upgrade test: built by
# its own module (hack/tools/etcd35), whose go.mod pins this version.
ETCD_PREVIOUS_VERSION := v3.5.35
ETCD_PREVIOUS_IMAGE := gcr.io/etcd-development/etcd:$(ETCD_PREVIOUS_VERSION)
VERSITYGW_IMAGE := ghcr.io/sharder-dev/versitygw:$(VERSITYGW_VERSION)
IMAGES := $(BIN)/images
# The platforms (os/arch) of the published images, the sharder's and the
# example operator's: make images cross-compiles their binaries for each into
# bin/images/<os>-<arch>/ and packs one OCI image index of them all per image
# (bin/images/oci/<name>/, an OCI image layout), which make push sends.
# Every image is also an image tarball for this machine's architecture
# (bin/images/<name>.tar), which the local cluster imports; the local
# cluster's own images are built for that architecture alone.
PLATFORMS ?= linux/amd64,linux/arm64
HOST_ARCH := $(shell $(GO) env GOARCH)
HOST_PLATFORM := linux/$(HOST_ARCH)
HOST_BINARIES := $(IMAGES)/linux-$(HOST_ARCH)
comma := ,
IMAGE_PLATFORMS = $(sort $(subst $(comma), ,$(PLATFORMS)))
image_binaries = $(foreach p,$(IMAGE_PLATFORMS),--binary $(p)=$(IMAGES)/$(subst /,-,$(p))/$(1))
IMAGETOOL := $(IMAGES)/imagetool
# make push and make chart-push: the registry (host and optional path) the
# images and the chart go to, the images' tag, and INSECURE=true for a
# registry that speaks plain HTTP.
REGISTRY ?=
TAG ?= $(IMAGE_TAG)
INSECURE ?=
ifneq ($(filter push chart-push,$(MAKECMDGOALS)),)
ifeq ($(REGISTRY),)
$(error REGISTRY is required, e.g. make push REGISTRY=registry.example.com/team TAG=$(IMAGE_TAG))
endif
endif
LDFLAGS := -s -w -X github.com/sharder-dev/sharder/cmd/sharder/app.version=$(VERSION)

TEST_TIMEOUT ?= 15m
# The race detector needs cgo and a C compiler; without one, tests run without it.
RACE ?= $(shell [ "$$($(GO) env CGO_ENABLED)" = 1 ] && command -v "$$($(GO) env CC)" >/dev/null 2>&1 && echo -race)

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target>\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-16s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Development

.PHONY: build
build: ## Build the sharder binary into bin/.
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/sharder ./cmd/sharder

.PHONY: images
images: $(VERSITYGW) ## Build the sharder and example operator images for PLATFORMS (an OCI index each, bin/images/oci/), and those and the local cluster's plain controller, shell controller, pause, etcd (current and previous minor) and S3 store images for this machine's architecture into bin/images/*.tar (cross-compiled from any OS, but for the shell controller's, which needs Linux and apt-get; no container engine needed).
	$(GO) build -o $(IMAGETOOL) ./hack/images
	@# Static Linux binaries, cross-compiled; go build leaves an up-to-date one untouched.
	for platform in $(IMAGE_PLATFORMS); do \
		out=$(IMAGES)/$${platform/\//-}; \
		export GOOS=$${platform%%/*} GOARCH=$${platform#*/} CGO_ENABLED=0; \
		$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $$out/sharder ./cmd/sharder; \
		$(GO) build -trimpath -ldflags '-s -w' -o $$out/etcd-operator ./examples/etcd-operator/cmd/etcd-operator; \
	done
	export GOOS=linux GOARCH=$(HOST_ARCH) CGO_ENABLED=0; \
	$(GO) build -trimpath -ldflags '-s -w' -o $(HOST_BINARIES)/plaincontroller ./e2e/plaincontroller; \
	(cd hack/tools && GOWORK=off $(GO) build -trimpath -ldflags '-s -w' -o $(HOST_BINARIES)/kubectl k8s.io/kubernetes/cmd/kubectl); \
	$(GO) build -trimpath -ldflags '-s -w' -o $(HOST_BINARIES)/pause ./hack/pause; \
	(cd hack/tools && GOWORK=off $(GO) build -trimpath -ldflags '-s -w' -o $(HOST_BINARIES)/etcd ./cmd/etcd); \
	(cd hack/tools/etcd35 && GOWORK=off $(GO) build -trimpath -ldflags '-s -w' -o $(HOST_BINARIES)/etcd-previous .)
	@# versitygw is also a tool of the local tests (bin/); another OS's build
	@# cannot go in an image, so there the image's is installed for Linux.
	@if [ "$$($(GO) env GOOS)" = linux ]; then ln -sf $(VERSITYGW) $(HOST_BINARIES)/versitygw; \
	elif [ ! -x $(HOST_BINARIES)/versitygw-$(VERSITYGW_VERSION) ]; then \
		tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
		GOWORK=off GOPATH=$$tmp GOMODCACHE=$$($(GO) env GOMODCACHE) GOBIN= GOOS=linux GOARCH=$(HOST_ARCH) CGO_ENABLED=0 \
			$(GO) install github.com/versity/versitygw/cmd/versitygw@$(VERSITYGW_VERSION); \
		mv $$tmp/bin/linux_$(HOST_ARCH)/versitygw $(HOST_BINARIES)/versitygw-$(VERSITYGW_VERSION); \
		ln -sf versitygw-$(VERSITYGW_VERSION) $(HOST_BINARIES)/versitygw; \
	fi
	$(IMAGETOOL) pack $(call image_binaries,sharder) --path /sharder --cmd run --ref $(SHARDER_IMAGE) --output $(IMAGES)/sharder.tar --layout $(IMAGES)/oci/sharder
	$(IMAGETOOL) pack $(call image_binaries,etcd-operator) --path /etcd-operator --ref $(OPERATOR_IMAGE) --output $(IMAGES)/etcd-operator.tar --layout $(IMAGES)/oci/etcd-operator
	$(IMAGETOOL) pack --binary $(HOST_BINARIES)/plaincontroller --path /plaincontroller --ref $(PLAIN_CONTROLLER_IMAGE) --output $(IMAGES)/plaincontroller.tar
	@# Its busybox comes from a Debian package: on Linux only (like the cluster that runs it).
	if [ "$$($(GO) env GOOS)" = linux ]; then \
		hack/busybox.sh $(HOST_BINARIES)/busybox $(HOST_ARCH); \
		$(IMAGETOOL) pack --binary $(HOST_BINARIES)/busybox --path /bin/sh \
			--layer /usr/local/bin/kubectl=$(HOST_BINARIES)/kubectl --layer /usr/local/bin/controller.sh=examples/shell-controller/controller.sh \
			--entrypoint /usr/local/bin/controller.sh --ref $(SHELL_CONTROLLER_IMAGE) --output $(IMAGES)/shell-controller.tar; \
	fi
	$(IMAGETOOL) pack --binary $(HOST_BINARIES)/pause --path /pause --ref $(PAUSE_IMAGE) --output $(IMAGES)/pause.tar
	@# etcd runs as root, as the upstream image does: its data volume is root's.
	$(IMAGETOOL) pack --binary $(HOST_BINARIES)/etcd --path /usr/local/bin/etcd --user '' --ref $(ETCD_IMAGE) --output $(IMAGES)/etcd.tar
	$(IMAGETOOL) pack --binary $(HOST_BINARIES)/etcd-previous --path /usr/local/bin/etcd --user '' --ref $(ETCD_PREVIOUS_IMAGE) --output $(IMAGES)/etcd-previous.tar
	$(IMAGETOOL) pack --binary $(HOST_BINARIES)/versitygw --path /usr/local/bin/versitygw --ref $(VERSITYGW_IMAGE) --output $(IMAGES)/versitygw.tar

# The test targets build the images for this machine's architecture only:
# the second doubles the time make images takes after a change.
# PLATFORMS=... on the command line builds others too.
test e2e e2e-cluster cluster demo: PLATFORMS = $(HOST_PLATFORM)

.PHONY: push
push: images ## Push the sharder and example operator images (every platform of PLATFORMS) to REGISTRY as REGISTRY/sharder:TAG and REGISTRY/etcd-operator:TAG (INSECURE=true: plain HTTP; credentials: docker login).
	@# The pushed images' digests also go to bin/images/pushed.txt, for signing.
	$(IMAGETOOL) push --registry $(REGISTRY) --tag $(TAG) $(if $(filter true,$(INSECURE)),--insecure) $(IMAGES)/oci/sharder $(IMAGES)/oci/etcd-operator | tee $(IMAGES)/pushed.txt

# Where make chart-push packages the chart.
CHARTS ?= $(BIN)/charts

.PHONY: chart-push
chart-push: $(HELM) ## Package the Helm chart and push it to oci://REGISTRY/charts/sharder (INSECURE=true: plain HTTP; credentials: helm registry login).
	rm -rf $(CHARTS)
	$(HELM) package charts/sharder --destination $(CHARTS)
	@# helm's report, with the chart's digest, also goes to $(CHARTS)/pushed.txt, for signing.
	$(HELM) push $(CHARTS)/sharder-*.tgz oci://$(REGISTRY)/charts $(if $(filter true,$(INSECURE)),--plain-http) 2>&1 | tee $(CHARTS)/pushed.txt

# The sharder CLI of a release, for its users: one archive per platform,
# SHA256SUMS and a krew manifest (hack/dist).
DIST ?= $(BIN)/dist
DIST_PLATFORMS ?= linux/amd64 linux/arm64 darwin/amd64 darwin/arm64 windows/amd64 windows/arm64

.PHONY: dist
dist: ## Build the sharder CLI for DIST_PLATFORMS into DIST (bin/dist): an archive each (tar.gz, zip for Windows) with the LICENSE, SHA256SUMS and the krew manifest of kubectl sharder; VERSION is the release's tag.
	rm -rf $(DIST) && mkdir -p $(DIST)/build
	binaries=; for platform in $(DIST_PLATFORMS); do \
		os=$${platform%%/*} arch=$${platform#*/} ext=; \
		if [ $$os = windows ]; then ext=.exe; fi; \
		out=$(DIST)/build/$$os-$$arch/sharder$$ext; \
		GOOS=$$os GOARCH=$$arch CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $$out ./cmd/sharder; \
		binaries="$$binaries --binary $$platform=$$out"; \
	done; \
	$(GO) run ./hack/dist archive --version $(VERSION) --out $(DIST) --license LICENSE --krew hack/dist/krew.yaml.tmpl $$binaries
	rm -rf $(DIST)/build

.PHONY: generate
generate: $(CONTROLLER_GEN) ## Generate deepcopy code, CRDs and RBAC.
	hack/generate.sh $(CONTROLLER_GEN)

.PHONY: lint
lint: $(GOLANGCI_LINT) $(ACTIONLINT) chart-lint ## Run golangci-lint (every module of the workspace), helm lint and actionlint (the GitHub Actions workflows), and check that every module is tidy (go mod tidy -diff).
	@# golangci-lint's ./... is one module's packages: it runs in each.
	for m in $(MODULES); do (cd $$m && $(GOLANGCI_LINT) run ./...); done
	$(ACTIONLINT)
	@# Each module's go.mod and go.sum as go mod tidy leaves them, the module
	@# alone (GOWORK=off), as a build that requires it sees it.
	for m in $(MODULES); do (cd $$m && GOWORK=off $(GO) mod tidy -diff) || { echo "$$m: run make tidy" >&2; exit 1; }; done

.PHONY: tidy
tidy: ## Run go mod tidy in every module of the workspace, each alone (GOWORK=off).
	for m in $(MODULES); do (cd $$m && GOWORK=off $(GO) mod tidy); done

.PHONY: chart-lint
chart-lint: $(HELM) ## Lint the Helm chart.
	$(HELM) lint charts/sharder --strict --kube-version $(patsubst v%,%,$(KUBERNETES_VERSION))

.PHONY: chart-crds
chart-crds: ## Copy the generated CRDs into the Helm chart (after make generate).
	cp config/crd/bases/*.yaml charts/sharder/crds/

.PHONY: test
test: control-plane node images $(HELM) $(PROMTOOL) $(PROMETHEUS) $(OCI_REGISTRY) $(ACTIONLINT) $(GOTESTSUM) ## Run every test: unit, integration (real API server), e2e, and e2e on a real cluster (as root).
	@# -count=1: the e2e suite builds the binaries it runs in a subprocess, which
	@# Go's test cache cannot see, so a cached e2e result could be stale.
	@# Two runs: every package but e2e (the real-cluster suite among them, with
	@# one other package at a time beside it), then e2e alone. The two
	@# end-to-end suites each load a 2-core machine enough that, run at once,
	@# one stalls the other's node or control plane past its instances' lease
	@# durations; run beside two other packages, the real-cluster suite's
	@# example operator missed its probes during its rolling update. A failed
	@# end-to-end test dumps its processes' logs; the failed tests' own
	@# messages are repeated at the end, where a reader of the tail sees them.
	@rm -f $(BIN)/test-output.json $(BIN)/test-output-e2e.json; status=0; \
	$(GOTESTSUM) --format testname --jsonfile $(BIN)/test-output.json -- $(RACE) -count=1 -timeout $(TEST_TIMEOUT) \
		$$($(GO) list $(ALL_PACKAGES) | grep -v '/e2e$$') || status=1; \
	$(GOTESTSUM) --format testname --jsonfile $(BIN)/test-output-e2e.json -- $(RACE) -count=1 -timeout $(TEST_TIMEOUT) ./e2e || status=1; \
	if [ $$status != 0 ]; then $(GO) run ./hack/testfailures $(BIN)/test-output.json $(BIN)/test-output-e2e.json; fi; \
	exit $$status

.PHONY: test-compat
test-compat: control-plane compat-control-plane $(HELM) $(PROMTOOL) $(GOTESTSUM) ## Run the suites that need only an API server against the oldest supported Kubernetes (COMPAT_KUBERNETES_VERSION); make test runs them against the newest.
	KUBEBUILDER_ASSETS=$(COMPAT_CONTROL_PLANE) $(GOTESTSUM) --format testname --jsonfile $(BIN)/test-output-compat.json -- \
		$(RACE) -count=1 -timeout $(TEST_TIMEOUT) $(COMPAT_PACKAGES) || { $(GO) run ./hack/testfailures $(BIN)/test-output-compat.json; exit 1; }

# The version-skew test (docs/versioning.md): the sharder of this tree with
# example operator instances built from an earlier revision's pkg/instance,
# by default the newest release tag v* before HEAD, or hack/skew/baseline while
# none is tagged. make test runs it with the rest of e2e.
SKEW_FROM ?=

.PHONY: test-skew
test-skew: control-plane ## Run the version-skew test: this tree's sharder with instances of the previous release (SKEW_FROM=<revision> for another).
	SKEW_FROM=$(SKEW_FROM) $(GO) test $(RACE) -count=1 -timeout $(TEST_TIMEOUT) -v -run '^TestSkewPreviousInstances$$' ./e2e/

.PHONY: e2e
e2e: control-plane node images $(HELM) $(PROMETHEUS) $(OCI_REGISTRY) ## Run only the end-to-end tests: processes on a local control plane, and the chart on a real cluster (as root).
	@# -p 1: the two suites one after the other (see test).
	$(GO) test -p 1 -count=1 -timeout $(TEST_TIMEOUT) -v ./e2e/...

# SHARDER_E2E_FLOWCONTROL_OBJECTS sets the size of the flow control scenarios'
# rebalance: 1,000 ConfigMaps on the real cluster and 400 on the local control
# plane by default; SHARDER_E2E_FLOWCONTROL_OBJECTS=10000 make e2e-cluster runs
# the size the chart's FlowSchemas are meant for (docs/real-cluster.md).
.PHONY: e2e-cluster
e2e-cluster: control-plane node images $(HELM) $(PROMETHEUS) $(OCI_REGISTRY) ## Run only the real-cluster suite (e2e/cluster, as root): it starts and stops make cluster itself.
	$(GO) test -count=1 -timeout $(TEST_TIMEOUT) -v ./e2e/cluster/...

# The fault-injection suite's long form: CHAOS_ROUNDS rounds of every fault
# (outages of 30-90s), from the schedule CHAOS_SEED draws; its table goes to
# CHAOS_REPORT. `make test` runs the short form (one round each, short outages).
CHAOS_ROUNDS ?= 3
CHAOS_SEED ?= 1
CHAOS_REPORT ?= $(BIN)/chaos-report.md

.PHONY: chaos
chaos: control-plane ## Run the fault-injection suite's long form (every fault CHAOS_ROUNDS times, in both assignment units, on a local control plane) and write its tables to CHAOS_REPORT.
	@rm -f $(CHAOS_REPORT)
	SHARDER_CHAOS_LONG=1 SHARDER_CHAOS_ROUNDS=$(CHAOS_ROUNDS) SHARDER_CHAOS_SEED=$(CHAOS_SEED) SHARDER_CHAOS_REPORT=$(CHAOS_REPORT) \
		$(GO) test -count=1 -timeout 3h -v -run '^TestChaos(Slots)?$$' ./e2e/

# Go benchmarks of what the sharder does per object, without a control plane's
# worth of objects.
MICRO_BENCHMARKS ?= UrgentObject|WorkQueueCycle|Lookup|Build|Balance|ResolverKey

.PHONY: bench
bench: control-plane ## Run the per-object Go benchmarks, then measure the sharder against the API server's floor on a local control plane (writes docs/benchmarks.md).
	@# The Go benchmarks that run the assignment on 10,000 objects (docs/assignment.md)
	@# are left to run by hand: hack/bench measures the same on the sharder process.
	$(GO) test -run '^$$' -bench '$(MICRO_BENCHMARKS)' -benchmem ./pkg/...
	$(GO) run ./hack/bench --output docs/benchmarks.md

# One ring of SCALE_INSTANCES instances whose Leases the benchmark process
# holds: takes a few minutes and most of a small machine, so it is run by hand.
# consistent-hash-dense is the algorithm for rings this large (docs/ring.md):
# consistent-hash takes seconds to build one above a hundred instances.
SCALE_INSTANCES ?= 1000
SCALE_ALGORITHM ?= consistent-hash-dense
# More flags for hack/bench, e.g. SCALE_ARGS=--keep to keep the run's folder:
# its logs (fleet.log: the holders' messages and their requests' latencies)
# and the sharder's CPU profiles.
SCALE_ARGS ?=

.PHONY: bench-scale
bench-scale: control-plane ## Measure one ring of SCALE_INSTANCES instances on a local control plane: the sharder's CPU while every Lease renews, and per membership change (writes docs/benchmarks-scale.md).
	$(GO) run ./hack/bench --scale --instances $(SCALE_INSTANCES) --algorithm $(SCALE_ALGORITHM) --output docs/benchmarks-scale.md $(SCALE_ARGS)

# One ring of BENCH_OBJECTS objects and 10 instances: BENCH_WATCHED_OBJECTS of
# them assigned from the sharder's watch, the rest labelled at creation as in
# admission mode. The control plane creates a few hundred objects a second on
# a small machine (200,000 took 25 minutes on 2 busy cores, a million takes
# well over an hour) and needs several GiB of memory, so it is run by hand.
BENCH_OBJECTS ?= 1000000
BENCH_WATCHED_OBJECTS ?= 100000

.PHONY: bench-objects
bench-objects: control-plane ## Measure one ring of BENCH_OBJECTS objects on a local control plane: the sharder's memory per object, start-up and scale-out, beside the API server's own figures (writes docs/benchmarks-objects.md).
	$(GO) run ./hack/bench --many-objects --objects $(BENCH_OBJECTS) --watched-objects $(BENCH_WATCHED_OBJECTS) --create-workers 64 --output docs/benchmarks-objects.md

# One ring of unit Slots (docs/design.md §11) in admission mode with
# SLOTS_OBJECTS objects and 3 in-process instances in slot mode: the writes,
# hand-over times and sharder CPU of a scale-out, a stop and a rolling
# restart, then the sharder's RSS again with SLOTS_LARGE_OBJECTS objects. Run
# by hand (a few minutes at 10,000 objects; the control plane creates a few
# hundred objects a second on a small machine).
SLOTS_OBJECTS ?= 10000
SLOTS_LARGE_OBJECTS ?= 50000

.PHONY: bench-slots
bench-slots: control-plane ## Measure one ring of unit Slots on a local control plane: writes and hand-overs per membership change, the sharder's RSS at two object counts (writes docs/benchmarks-slots.md).
	$(GO) run ./hack/bench --slots --objects $(SLOTS_OBJECTS) --large-objects $(SLOTS_LARGE_OBJECTS) --create-workers 64 --output docs/benchmarks-slots.md

# make demo runs on a local control plane; make demo CLUSTER=real on the real
# one-node cluster, which it starts (make cluster) and leaves running.
CLUSTER ?= local
# make demo runs the ring in label mode (unit Objects: each object's instance
# in its shard label); make demo UNIT=slots in slot mode (unit Slots, the
# example's config-slots: slots move, objects are not written).
UNIT ?= labels
ifneq ($(filter demo,$(MAKECMDGOALS)),)
ifeq ($(filter labels slots,$(UNIT)),)
$(error UNIT=$(UNIT): want labels (the default: a ring of unit Objects) or slots (a ring of unit Slots))
endif
endif

.PHONY: demo
demo: control-plane $(if $(filter real,$(CLUSTER)),node images $(HELM)) ## Run the sharder, three example operator instances and 100 EtcdClusters on a local control plane; CLUSTER=real: on the real cluster (as root), left running; UNIT=slots: the ring in slot mode.
ifeq ($(CLUSTER),real)
	$(MAKE) --no-print-directory cluster
	hack/demo.sh --cluster-kubeconfig $(CLUSTER_DIR)/kubeconfig --helm $(HELM) --unit $(UNIT)
else ifeq ($(CLUSTER),local)
	hack/demo.sh --unit $(UNIT)
else
	@echo "CLUSTER=$(CLUSTER): want local (a bare control plane) or real (make cluster)" >&2; exit 1
endif

.PHONY: local-control-plane
local-control-plane: control-plane ## Run a bare local control plane (etcd + kube-apiserver, sharder CRD) until Ctrl-C.
	$(GO) run ./hack/local-control-plane --kubeconfig $(BIN)/local/kubeconfig --crds config/crd/bases

.PHONY: cluster
cluster: control-plane node images ## Start a real one-node cluster as root (kubeconfig: bin/cluster/kubeconfig); make cluster-down stops it.
	$(GO) run ./hack/cluster up --dir $(CLUSTER_DIR) --control-plane $(CONTROL_PLANE) --node $(NODE) --images $(IMAGES) --pause-image $(PAUSE_IMAGE)

.PHONY: cluster-down
cluster-down: ## Stop the local cluster and undo its changes to the host (also after a killed run).
	$(GO) run ./hack/cluster down --dir $(CLUSTER_DIR)

.PHONY: clean
clean: ## Remove built binaries and tools (bin/).
	@# The cluster's mounts live under bin/: never remove through them.
	@if [ -e $(CLUSTER_DIR)/host.json ]; then echo "the local cluster may be running (make cluster-down first)" >&2; exit 1; fi
	rm -rf $(BIN) dist

##@ Dependencies

.PHONY: control-plane
control-plane: $(CONTROL_PLANE)/kube-apiserver ## Build etcd, kube-apiserver and kubectl from Go modules (cached).

$(CONTROL_PLANE)/kube-apiserver:
	hack/build-control-plane.sh $(CONTROL_PLANE)

.PHONY: compat-control-plane
compat-control-plane: $(COMPAT_CONTROL_PLANE)/kube-apiserver ## Build the oldest supported minor's kube-apiserver from Go modules (cached), beside the local control plane's etcd and kubectl.

$(COMPAT_CONTROL_PLANE)/kube-apiserver: | $(CONTROL_PLANE)/kube-apiserver
	hack/build-control-plane.sh $(COMPAT_CONTROL_PLANE) hack/tools/compat $(CONTROL_PLANE)

.PHONY: node
node: ## Build the local cluster's kubelet, controller manager, scheduler, kube-proxy and containerd (cached).
	@# The script does nothing when every binary is there.
	@hack/build-cluster.sh $(NODE) $(CONTAINERD_VERSION)

.PHONY: tools
tools: $(CONTROLLER_GEN) $(HELM) $(PROMTOOL) $(PROMETHEUS) $(OCI_REGISTRY) $(ACTIONLINT) $(GOTESTSUM) $(VERSITYGW) ## Install the pinned tools into bin/ (cached).

.PHONY: promtool
promtool: $(PROMTOOL) ## Build promtool from Go modules into bin/ (cached): the chart's alert and dashboard tests run it.

.PHONY: prometheus
prometheus: $(PROMETHEUS) ## Build the Prometheus server from Go modules into bin/ (cached): the real-cluster suite scrapes the sharder with it.

.PHONY: registry
registry: $(OCI_REGISTRY) ## Build distribution's OCI registry from Go modules into bin/ (cached): the real-cluster suite pushes to it and the local cluster pulls from it.

$(CONTROLLER_GEN):
	hack/go-install.sh controller-gen sigs.k8s.io/controller-tools/cmd/controller-gen $(CONTROLLER_GEN_VERSION)
$(GOLANGCI_LINT):
	hack/go-install.sh golangci-lint github.com/golangci/golangci-lint/v2/cmd/golangci-lint $(GOLANGCI_LINT_VERSION)
$(HELM):
	hack/go-install.sh helm helm.sh/helm/v3/cmd/helm $(HELM_VERSION)
$(PROMTOOL):
	@# The version named here must be the one the module pins.
	@pinned=$$(cd hack/tools/promtool && GOWORK=off $(GO) list -m -f '{{.Version}}' github.com/prometheus/prometheus); \
	if [ "$$pinned" != $(PROMETHEUS_VERSION) ]; then echo "hack/tools/promtool/go.mod pins $$pinned, the Makefile $(PROMETHEUS_VERSION)" >&2; exit 1; fi
	cd hack/tools/promtool && GOWORK=off $(GO) build -tags remove_all_sd -ldflags '-s -w' -o $(PROMTOOL).tmp github.com/prometheus/prometheus/cmd/promtool
	mv $(PROMTOOL).tmp $(PROMTOOL)
	ln -sf $(notdir $(PROMTOOL)) $(BIN)/promtool
$(PROMETHEUS): $(PROMTOOL)
	@# The same module and version as promtool (checked there); of the service
	@# discovery plugins only Kubernetes'.
	cd hack/tools/promtool && GOWORK=off $(GO) build -tags remove_all_sd,enable_kubernetes_sd -ldflags '-s -w' -o $(PROMETHEUS).tmp github.com/prometheus/prometheus/cmd/prometheus
	mv $(PROMETHEUS).tmp $(PROMETHEUS)
	ln -sf $(notdir $(PROMETHEUS)) $(BIN)/prometheus
$(ACTIONLINT):
	hack/go-install.sh actionlint github.com/rhysd/actionlint/cmd/actionlint $(ACTIONLINT_VERSION)
$(GOTESTSUM):
	hack/go-install.sh gotestsum gotest.tools/gotestsum $(GOTESTSUM_VERSION)
$(OCI_REGISTRY):
	CGO_ENABLED=0 hack/go-install.sh registry github.com/distribution/distribution/v3/cmd/registry $(DISTRIBUTION_VERSION)
$(VERSITYGW):
	@# Static: it also runs as an image without a C library.
	CGO_ENABLED=0 hack/go-install.sh versitygw github.com/versity/versitygw/cmd/versitygw $(VERSITYGW_VERSION)
