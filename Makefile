# rtcedge — see README.md.
GO      ?= go
BIN     := bin/rtcedge
PKGS    := ./...
# Packages whose benchmarks make up `make bench`.
BENCH_PKGS := ./internal/... ./globalrelay/... ./clusterrelay/... ./transceiver/... ./netsim/...

.PHONY: run build test test-deps bench lint clean

run: build
	./$(BIN) dev

build:
	$(GO) build -o $(BIN) ./cmd/rtcedge

test-deps:
	./scripts/test-deps.sh

test: test-deps
	$(GO) vet $(PKGS)
	$(GO) test -race -count=1 -timeout 30m $(PKGS)

bench:
	$(GO) test -run '^$$' -bench . -benchmem -count 1 $(BENCH_PKGS)

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)

clean:
	rm -rf bin
