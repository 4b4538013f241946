# rtcedge — see README.md.
GO      ?= go
BIN     := bin/rtcedge
PKGS    := ./...
# Packages whose benchmarks make up `make bench`.
BENCH_PKGS := ./internal/... ./globalrelay/... ./clusterrelay/... ./transceiver/... ./netsim/...

# The container image (Containerfile): rtcedge:$(VERSION), the tag scheme the
# Terraform modules' image variables follow (docs/deploy.md).
VERSION    ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
IMAGE_REPO ?= rtcedge
IMAGE      ?= $(IMAGE_REPO):$(VERSION)

# The no-allocation guards: every test that calls testing.AllocsPerRun and
# the packages that have one, found afresh on each run. -race makes
# allocation counts meaningless (and some of these tests skip under it),
# so `make test` runs them once more without it.
ALLOC_FILES = $(shell grep -rl --include='*_test.go' 'testing.AllocsPerRun' --exclude-dir=.git .)
ALLOC_TESTS = $(shell awk '/^func Test/ { n = $$2; sub(/[^A-Za-z0-9_].*/, "", n) } /testing\.AllocsPerRun/ { print n }' $(ALLOC_FILES) | sort -u | paste -sd'|')
ALLOC_PKGS  = $(sort $(dir $(ALLOC_FILES)))
# The tests that cannot run under -race (files tagged //go:build !race,
# each saying why): `make test` runs every test of theirs once more without
# it, so none is left out of the suite.
NORACE_FILES = $(shell grep -rl --include='*_test.go' '^//go:build !race' --exclude-dir=.git .)
NORACE_TESTS = $(shell awk '/^func Test/ { n = $$2; sub(/[^A-Za-z0-9_].*/, "", n); print n }' $(NORACE_FILES) | sort -u | paste -sd'|')
NORACE_PKGS  = $(sort $(dir $(NORACE_FILES)))

# The heap-bound tests: every test that measures with internal/heaptest.
# -race slows a world 2-20 times and distorts what it holds mid-flood (the
# whole-world one, e2e TestPerCallBounds, skips under it), so `make test`
# runs them once more without it.
HEAP_FILES = $(shell grep -rl --include='*_test.go' 'heaptest\.Live' --exclude-dir=.git .)
HEAP_TESTS = $(shell awk '/^func Test/ { n = $$2; sub(/[^A-Za-z0-9_].*/, "", n) } /heaptest\.Live/ { print n }' $(HEAP_FILES) | sort -u | paste -sd'|')
HEAP_PKGS  = $(sort $(dir $(HEAP_FILES)))

.PHONY: run run-realtime build build-deps test test-deps test-allocs test-heap bench lint clean sim bench-capacity bench-relay image soak bpf bpf-check test-k8s test-k8s-run

run: build
	./$(BIN) dev

# The dev world with every pod behind the OpenAI Realtime protocol, talking
# to the reference server started in-process (docs/backends.md).
run-realtime: build
	./$(BIN) dev -backend ref

# libopus (internal/opus, through cgo) and what links it: installed by
# scripts/build-deps.sh when missing, a no-op otherwise.
build: build-deps
	$(GO) build -o $(BIN) ./cmd/rtcedge

build-deps:
	./scripts/build-deps.sh

# Builds with podman, or docker when podman is not installed.
image:
	VERSION=$(VERSION) IMAGE=$(IMAGE) GO=$(GO) ./scripts/build-image.sh

test-deps: build-deps
	./scripts/test-deps.sh

test: test-deps
	$(GO) vet $(PKGS)
	$(GO) test -race -count=1 -timeout 30m $(PKGS)
	$(MAKE) test-allocs
	$(MAKE) test-heap

test-heap:
	@test -n "$(HEAP_TESTS)" || { echo "no heap-bound tests found"; exit 1; }
	$(GO) test -count=1 -timeout 20m -run '^($(HEAP_TESTS))$$' $(HEAP_PKGS)

test-allocs:
	@test -n "$(ALLOC_TESTS)" || { echo "no allocation tests found"; exit 1; }
	$(GO) test -count=1 -run '^($(ALLOC_TESTS))$$' $(ALLOC_PKGS)
	@test -z "$(NORACE_FILES)" || $(GO) test -count=1 -timeout 20m -run '^($(NORACE_TESTS))$$' $(NORACE_PKGS)

# The multi-region simulation, verbose, with more calls, Chromium when
# installed, and its report in bin/sim/ (see docs/simulation.md).
sim:
	RTCEDGE_SIM_CALLS=10 RTCEDGE_SIM_PHONE=1 RTCEDGE_SIM_BROWSER=1 RTCEDGE_SIM_BROWSER_CALLS=20 RTCEDGE_SIM_REPORT_DIR=$(CURDIR)/bin/sim \
		$(GO) test -count=1 -v -timeout 10m -run TestSimulation ./sim/

# The Terraform modules applied, updated, rotated and destroyed against a
# real kube-apiserver and etcd (scripts/k8s, docs/deploy.md); run it before
# every change to terraform/. Not part of make test: the Kubernetes provider
# is not served by the module proxy and must be built once from its source
# into K8S_TOOLS (README.md, "Testing the Terraform modules"); without it
# the target says so and skips.
K8S_TOOLS    ?= $(HOME)/.cache/rtcedge-k8s
K8S_PROVIDER := $(K8S_TOOLS)/providers/registry.opentofu.org/hashicorp/kubernetes/2.38.0/linux_amd64/terraform-provider-kubernetes_v2.38.0
test-k8s:
	@if [ ! -x "$(K8S_PROVIDER)" ]; then \
		echo "************************************************************************"; \
		echo "test-k8s: SKIPPED, nothing tested: no Kubernetes provider at"; \
		echo "  $(K8S_PROVIDER)"; \
		echo "Build it once from hashicorp/terraform-provider-kubernetes v2.38.0:"; \
		echo "  go build -o <that path> .   (in the provider's source; README.md)"; \
		echo "************************************************************************"; \
	else \
		$(MAKE) --no-print-directory test-k8s-run; \
	fi

# The run itself, once test-k8s has found the provider.
test-k8s-run:
	command -v etcd >/dev/null || ./scripts/apt-install.sh test-k8s etcd-server
	cd scripts/k8s && $(GO) build -o $(K8S_TOOLS)/bin/kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver
	cd scripts/k8s/tofu && $(GO) build -o $(K8S_TOOLS)/bin/tofu github.com/opentofu/opentofu/cmd/tofu
	cd scripts/k8s && $(GO) run . -tools $(K8S_TOOLS) -modules $(CURDIR)/terraform/modules

bench:
	$(GO) test -run '^$$' -bench . -benchmem -count 1 $(BENCH_PKGS)

# Soak and chaos run (docs/benchmarks.md): SOAK_CALLS calls for
# SOAK_DURATION while relays, Redis and a POP are killed and restarted; not
# part of make test.
SOAK_DURATION ?= 10m
SOAK_CALLS ?= 20
soak:
	$(GO) test -tags soak -count=1 -timeout 0 -v -run TestSoak ./bench/soak -args -duration $(SOAK_DURATION) -calls $(SOAK_CALLS)

# Transceiver capacity (docs/benchmarks.md): the pod as its own process under
# a stepped load of 50 pps voice sessions; a few minutes, prints a table.
# CAPACITY_FLAGS adds flags, e.g. -steps 300 -profile bin/capacity-prof;
# -backend ref runs the reference Realtime server as a third process, and the
# table shows the CPU of the pod, the load generator and the server apart;
# -pod-cpus 1 pins the pod to a core of its own (the load generator and the
# server to the others) and judges each step against that core.
bench-capacity: build
	$(GO) run ./bench/capacity/cmd/capacity -bin $(BIN) -json bin/bench-capacity.json $(CAPACITY_FLAGS)

# Relays against a minimal C forwarder (docs/benchmarks.md, "Relays at the
# limit of one hop"): direct, C, the C forwarder written in Go (goblock,
# goepoll), naive Go, global relay, and the two-tier chain against two
# chained C forwarders, voice and flood, each process pinned; a few minutes,
# prints a table and writes bin/bench-relay.json. Needs gcc; run as root for
# SCHED_FIFO (see the doc). BENCH_RELAY_FLAGS="-rounds 3" repeats the run and
# prints each path's median against each run's own C forwarder. The second
# run (root) puts every process on a host of its own over veth pairs and adds
# the in-kernel fast path (docs/fastpath.md) at 25 k and 64 k datagrams/s each
# way, counting the whole machine's CPU per datagram and the programs' own run
# time; it writes bin/bench-relay-veth.json (BENCH_RELAY_VETH_FLAGS). With
# SCHED_FIFO hops it raises ksoftirqd above them for the run (and restores
# it): over veth much of the work is softirq that the kernel defers there.
bench-relay:
	$(GO) run ./bench/relay/cmd/relaybench -json bin/bench-relay.json $(BENCH_RELAY_FLAGS)
	$(GO) run ./bench/relay/cmd/relaybench -veth -voice 500x50 -flood 128x500 -json bin/bench-relay-veth.json $(BENCH_RELAY_VETH_FLAGS)

lint: build-deps bpf-check
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)

# The kernel programs of the fast path (docs/fastpath.md): C under
# internal/fastpath/bpf, compiled by bpf2go into committed objects so that
# building needs no clang. `make bpf` regenerates them (needs clang, llvm
# and libbpf-dev) and records the sources' hash; `make bpf-check` (part of
# lint) fails when the C changed since.
bpf:
	@command -v clang >/dev/null || { echo "make bpf needs clang: apt-get install clang llvm libbpf-dev"; exit 1; }
	$(GO) generate ./internal/fastpath

bpf-check:
	@cd internal/fastpath/bpf && sha256sum --quiet -c sources.sha256 || { echo "internal/fastpath/bpf changed since its objects were generated: run make bpf and commit the result"; exit 1; }

clean:
	rm -rf bin
