# edgeproxy — see README.md.
#   make build   static binary into bin/edgeproxy
#   make demo    print the plan for the bundled demo manifests, then (root)
#                answer a request through a ClusterIP in a throwaway namespace
#   make test    every test tier (unit, kernel in network namespaces, real
#                kube-apiserver, the IPVS VM) plus go vet
#   make bench   edgeproxy vs kube-proxy side by side (test/bench)
SHELL   := /bin/bash
GO      ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
BIN     := bin/edgeproxy
CACHE   ?= $(HOME)/.cache/edgeproxy
# As root every tier can run, so a skipped tier is a failure (see test/gate);
# elsewhere tests that need root skip with their reason.
REQUIRE_ALL ?= $(shell [ "$$(id -u)" = 0 ] && echo 1 || echo 0)
TEST_FLAGS  ?= -race -timeout 40m
DESTDIR ?=

.PHONY: all build modules cluster-bins deps demo test vet fuzz fuzz-smoke bench bench-micro install clean

all: build

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w -X main.version=$(VERSION)" -o $(BIN) ./agent/cmd/edgeproxy
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
# needs root and the kernel tools (installed by test/deps.sh when missing); it
# never reports success for a part it did not run.
demo: build
	./$(BIN) plan --config configs/demo.yaml --node-name demo-node
	@if [ "$$(id -u)" != 0 ]; then \
		echo "make demo: the namespace half needs root (network namespaces and iptables); run it as root" >&2; exit 1; fi
	@test/deps.sh
	@set -o pipefail; EDGEPROXY_REQUIRE_ALL=1 EDGEPROXY_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -v -run TestDemo ./test/demo \
		| grep -v '^\(=== \|--- PASS\|PASS\|ok \)' \
		|| { echo "make demo: the namespace demo failed (see above)" >&2; exit 1; }

vet:
	$(GO) vet ./...
	$(GO) mod tidy -diff

# Debian packages the tiers need (installed when missing and root).
deps:
	test/deps.sh

# Native Go fuzz targets (package:target): decoders of outside input and
# the plan sanitizer. make test runs each for FUZZ_SMOKE; make fuzz for FUZZTIME.
FUZZ_TARGETS := ./agent/source:FuzzManifest ./agent/config:FuzzLoad ./agent/snapshot:FuzzDecode \
	./policy/abi:FuzzDecode ./datapath:FuzzSanitize
FUZZ_SMOKE ?= 5s
FUZZTIME   ?= 10m
fuzz-smoke:
	@for t in $(FUZZ_TARGETS); do \
		$(GO) test -run '^$$' -fuzz "^$${t#*:}$$" -fuzztime $(FUZZ_SMOKE) $${t%%:*} || exit 1; done
fuzz:
	@for t in $(FUZZ_TARGETS); do \
		$(GO) test -run '^$$' -fuzz "^$${t#*:}$$" -fuzztime $(FUZZTIME) $${t%%:*} || exit 1; done

test: deps build modules cluster-bins vet fuzz-smoke
	EDGEPROXY_REQUIRE_ALL=$(REQUIRE_ALL) EDGEPROXY_BIN=$(CURDIR)/$(BIN) EDGEPROXY_CACHE=$(CACHE) \
		CGO_ENABLED=1 $(GO) test $(TEST_FLAGS) ./...

# edgeproxy against upstream kube-proxy v1.36.3, one at a time, on a real
# API server (test/bench/README.md). BENCH_SIZE=quick (1k services, about
# 15 minutes), full (1k/5k/10k, the committed test/bench/RESULTS.md), or
# service counts like 1000,5000. Needs root. Report in $(BENCH_OUT)/report.md.
BENCH_SIZE  ?= quick
BENCH_OUT   ?= bench-out
BENCH_FLAGS ?=
bench: deps build modules cluster-bins
	EDGEPROXY_CACHE=$(CACHE) $(GO) run ./test/bench/cmd/epbench -size $(BENCH_SIZE) -out $(BENCH_OUT) \
		-edgeproxy $(BIN) -module bin/modules/topology.wasm $(BENCH_FLAGS)

# The Go micro-benchmarks (render, sync, policy calls, snapshot).
bench-micro: build
	CGO_ENABLED=1 $(GO) test -run '^$$' -bench . -benchtime 3x ./agent/... ./datapath/... ./policy/...

install: build modules
	deploy/install.sh DESTDIR=$(DESTDIR) BINARY=$(BIN) MODULES=bin/modules

clean:
	rm -rf bin
