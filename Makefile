# edgeproxy — see README.md.
#   make build   static binary into bin/edgeproxy
#   make demo    print the plan for the bundled demo manifests, then (root)
#                answer a request through a ClusterIP in a throwaway namespace
#   make test    every test tier (unit, kernel in network namespaces, real
#                kube-apiserver, the IPVS VM) in both Go modules, plus go vet
#   make bench   edgeproxy vs kube-proxy side by side (test/bench)
#   make package .deb and .rpm for amd64 and arm64 into bin/pkg (deploy/package)
SHELL   := /bin/bash
GO      ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT  ?= $(shell git describe --always --dirty --abbrev=12 --match=NONE 2>/dev/null)
BIN     := bin/edgeproxy
CACHE   ?= $(HOME)/.cache/edgeproxy
# As root every tier can run, so a skipped tier is a failure (see
# internal/testkit/gate); elsewhere tests that need root skip with their reason.
REQUIRE_ALL ?= $(shell [ "$$(id -u)" = 0 ] && echo 1 || echo 0)
TEST_FLAGS  ?= -race -timeout 40m
DESTDIR ?=
# The Go modules of the repository: the agent (.), the test harness (test:
# the API, namespace, fault, VM, conformance and benchmark tiers, with their
# heavier dependencies) and the packager (deploy/package).
MODULES := . test deploy/package

.PHONY: all build modules cluster-bins deps deps-demo demo test vet fuzz fuzz-smoke bench bench-micro install package clean

all: build

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT)" -o $(BIN) ./agent/cmd/edgeproxy
	@file $(BIN) | grep -q "statically linked" || { echo "$(BIN) is not statically linked" >&2; exit 1; }

# Example policy modules, built from source (never checked in).
modules:
	modules/build.sh bin/modules

# etcd, kube-apiserver, kube-controller-manager and kube-proxy v1.36.3 from
# source, cached under $(CACHE) (a few minutes the first time).
cluster-bins:
	EDGEPROXY_CACHE=$(CACHE) test/cluster/build.sh

# First the plan for the bundled manifests; then edgeproxy programs a
# throwaway network namespace (iptables mode) and a request through a
# ClusterIP is answered by a pod; everything is removed after. The second half
# needs root, iptables and iproute2 (test/deps.sh's demo group, installed when
# missing: nothing else, so a fresh machine is ready in minutes); it never
# reports success for a part it did not run. The test is built with make
# build's flags (no cgo, -trimpath), so it reuses the packages the binary
# compiled instead of compiling them all again.
demo: deps-demo build
	./$(BIN) plan --config configs/demo.yaml --node-name demo-node
	@if [ "$$(id -u)" != 0 ]; then \
		echo "make demo: the namespace half needs root (network namespaces and iptables); run it as root" >&2; exit 1; fi
	@set -o pipefail; EDGEPROXY_REQUIRE_ALL=1 EDGEPROXY_BIN=$(CURDIR)/$(BIN) CGO_ENABLED=0 $(GO) -C test test -trimpath -count=1 -v -run TestDemo ./demo \
		| grep -v '^\(=== \|--- PASS\|PASS\|ok \)' \
		|| { echo "make demo: the namespace demo failed (see above)" >&2; exit 1; }

vet:
	@set -e; for m in $(MODULES); do \
		echo "go vet, go mod tidy -diff: $$m"; $(GO) -C $$m vet ./...; $(GO) -C $$m mod tidy -diff; done

# Debian packages every tier needs (installed when missing and root); make
# demo installs only its own group (test/deps.sh lists the groups).
deps:
	test/deps.sh
deps-demo:
	@test/deps.sh demo

# Native Go fuzz targets (package:target): decoders of outside input and
# the plan sanitizer. make test runs each for FUZZ_SMOKE executions; make fuzz
# for FUZZTIME. The smoke budget is a count, not a duration: a duration is a
# deadline that Go's fuzz coordinator can race on a busy machine and report as
# "context deadline exceeded" with no input found (a count has no deadline).
FUZZ_TARGETS := ./agent/source:FuzzManifest ./agent/config:FuzzLoad ./agent/snapshot:FuzzDecode \
	./policy/abi:FuzzDecode ./datapath:FuzzSanitize ./datapath:FuzzSanitizer
FUZZ_SMOKE ?= 50000x
FUZZTIME   ?= 10m
fuzz-smoke:
	@for t in $(FUZZ_TARGETS); do \
		$(GO) test -run '^$$' -fuzz "^$${t#*:}$$" -fuzztime $(FUZZ_SMOKE) $${t%%:*} || exit 1; done
fuzz:
	@for t in $(FUZZ_TARGETS); do \
		$(GO) test -run '^$$' -fuzz "^$${t#*:}$$" -fuzztime $(FUZZTIME) $${t%%:*} || exit 1; done

# The agent's module, then the test harness's, with the same environment and
# flags; both run even when the first fails, and either failing fails.
test: deps build modules cluster-bins vet package fuzz-smoke
	$(GO) -C deploy/package test -count=1 ./...
	@rc=0; for m in . test; do \
		echo "go test $(TEST_FLAGS) ./... in module $$m"; \
		EDGEPROXY_REQUIRE_ALL=$(REQUIRE_ALL) EDGEPROXY_BIN=$(CURDIR)/$(BIN) EDGEPROXY_CACHE=$(CACHE) \
		EDGEPROXY_PACKAGES=$(CURDIR)/$(PKG_OUT) EDGEPROXY_PACKAGER=$(CURDIR)/$(PACKAGER) \
		CGO_ENABLED=1 $(GO) -C $$m test $(TEST_FLAGS) ./... || rc=1; done; exit $$rc

# edgeproxy against upstream kube-proxy v1.36.3, one at a time, on a real
# API server (test/bench/README.md). BENCH_SIZE=quick (1k services, about
# 25 minutes), full (1k/5k/10k, the committed test/bench/RESULTS.md), or
# service counts like 1000,5000. Needs root. Report in $(BENCH_OUT)/report.md.
BENCH_SIZE  ?= quick
BENCH_OUT   ?= bench-out
BENCH_FLAGS ?=
bench: deps build modules cluster-bins
	$(GO) -C test build -o $(CURDIR)/bin/epbench ./bench/cmd/epbench
	EDGEPROXY_CACHE=$(CACHE) bin/epbench -size $(BENCH_SIZE) -out $(BENCH_OUT) \
		-edgeproxy $(BIN) -module bin/modules/topology.wasm $(BENCH_FLAGS)

# The Go micro-benchmarks (render, sync, policy calls, snapshot).
bench-micro: build
	CGO_ENABLED=1 $(GO) test -run '^$$' -bench . -benchtime 3x ./agent/... ./datapath/... ./policy/...

install: build modules
	deploy/install.sh DESTDIR=$(DESTDIR) BINARY=$(BIN) MODULES=bin/modules

# Packages for a fleet (deploy/package, an nfpm program in its own Go
# module): edgeproxy_<version>_<arch>.deb and edgeproxy-<version>-1.<arch>.rpm.
# The version is the first release heading of CHANGELOG.md, as is when HEAD
# is tagged v<version>, else <version>~dev.<commits>.g<commit> (sorts before
# the release). The man page and completions come from bin/edgeproxy.
PKG_ARCHES  ?= amd64 arm64
PKG_OUT     ?= bin/pkg
PKG_BASE    := $(shell sed -n 's/^## \([0-9][0-9.]*\).*/\1/p' CHANGELOG.md | head -n 1)
PKG_VERSION ?= $(shell if git describe --exact-match --tags --match 'v$(PKG_BASE)' >/dev/null 2>&1; then echo $(PKG_BASE); \
	else echo "$(PKG_BASE)~dev.$$(git rev-list --count HEAD 2>/dev/null || echo 0).g$$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"; fi)
PKG_DATE    ?= $(shell git log -1 --format=%cs 2>/dev/null || date -u +%F)
PACKAGER    := bin/edgeproxy-package
package: build modules
	$(GO) -C deploy/package build -o $(CURDIR)/$(PACKAGER) .
	rm -f $(PKG_OUT)/*.deb $(PKG_OUT)/*.rpm
	@set -e; for a in $(PKG_ARCHES); do \
		echo "building $(PKG_OUT)/$$a/edgeproxy ($(PKG_VERSION))"; \
		CGO_ENABLED=0 GOOS=linux GOARCH=$$a $(GO) build -trimpath -ldflags "-s -w -X main.version=$(PKG_VERSION) -X main.commit=$(COMMIT)" \
			-o $(PKG_OUT)/$$a/edgeproxy ./agent/cmd/edgeproxy; \
		file $(PKG_OUT)/$$a/edgeproxy | grep -q "statically linked" || { echo "$(PKG_OUT)/$$a/edgeproxy is not statically linked" >&2; exit 1; }; \
		$(PACKAGER) -src $(CURDIR) -version '$(PKG_VERSION)' -arch $$a -binary $(PKG_OUT)/$$a/edgeproxy \
			-cli $(BIN) -modules bin/modules -out $(PKG_OUT) -date $(PKG_DATE); \
	done

clean:
	rm -rf bin

# The upstream [sig-network] Services e2e tests on a real one-node cluster
# (kubelet, containerd, CNI, CoreDNS), first with kube-proxy, then with
# edgeproxy installed as deploy/daemonset.yaml; root, not part of make test
# (test/upstream/README.md says what works and how long it takes).
.PHONY: e2e-upstream
e2e-upstream:
	EDGEPROXY_CACHE=$(CACHE) test/upstream/run.sh suite
