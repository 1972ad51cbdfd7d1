# jetfabric: make demo runs the main job on the embedded default; make test passes the tests.
GO       ?= go
BIN      ?= bin
PKGS     := ./...
VERSION  ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -s -w -X main.version=$(VERSION)

.PHONY: all build build-gpu demo up test test-race test-nocgo test-gpu vet fmt-check fuzz bench lint tidy clean

all: build

## build: static binary without cgo (CPU backend only), runs anywhere
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/jetfabric ./cmd/jetfabric

## build-gpu: cgo build that finds the NVIDIA driver at run time (links no NVIDIA library)
build-gpu:
	CGO_ENABLED=1 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/jetfabric-gpu ./cmd/jetfabric

## demo: the main job on the embedded default (broker and a CPU worker in one process)
demo:
	$(GO) run ./cmd/jetfabric demo

## up: embedded broker and CPU workers on 127.0.0.1:4222, store in ./.jetfabric
up:
	$(GO) run ./cmd/jetfabric up --store .jetfabric/store --cpus 2

## test: vet, format check, tests with -race, tests again without cgo
test: vet fmt-check test-race test-nocgo

test-race:
	$(GO) test -race -count=1 -timeout 15m $(PKGS)

test-nocgo:
	CGO_ENABLED=0 $(GO) test -count=1 -timeout 15m $(PKGS)

## test-gpu: GPU tests where a driver is present (they skip elsewhere)
test-gpu:
	CGO_ENABLED=1 $(GO) test -count=1 -v -run . ./kernels/cuda/...

vet:
	$(GO) vet $(PKGS)
	CGO_ENABLED=0 $(GO) vet $(PKGS)

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

## fuzz: a short run of every fuzz target
fuzz:
	$(GO) test -run x -fuzz FuzzDecodeFrame -fuzztime 30s ./codec
	$(GO) test -run x -fuzz FuzzParseOps -fuzztime 15s ./subjects

## bench: package benchmarks, then the fabric against raw NATS
bench:
	$(GO) test -run x -bench . -benchtime 2s ./kernels/cpu ./codec
	$(GO) run ./cmd/jetfabric bench

tidy:
	$(GO) mod tidy
	git diff --exit-code go.mod go.sum

clean:
	rm -rf $(BIN) .gpu
