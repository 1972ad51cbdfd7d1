#!/usr/bin/env bash
# The training targets on one many-core host, ratios taken in one run:
#   1. a CPU training step on 2 cores against PyTorch on the same 2 cores
#      (jetfabric train, embedded fabric, against examples/torch/step_time.py);
#   2. data-parallel CNN training on 4 CPU workers of 4 cores each against
#      one (a broker and worker processes on this host), the backward
#      replayed in two parts (the default) and whole (--no-split).
# usage: bench/train.sh [rounds]    (from the repository root)
# Environment: JF (jetfabric binary; built into bin/ if unset), PYTHON
# (python3 with torch), CORES (the 2 cores of part 1, default 2,3),
# XFER (memory or file: the broker's --xfer-storage of part 2, default
# memory), PARTS ("cpu dp" by default), MODELS (of part 1, "mlp cnn"),
# WORKER_CORES (of each worker of part 2, default 4; with fewer, the broker
# and the client run on the cores left over), DATA (the directory of the
# four MNIST .gz files; default: the GoMNIST module in the Go module cache).
set -euo pipefail
rounds=${1:-2}
cores=${CORES:-2,3}
py=${PYTHON:-python3}
xfer=${XFER:-memory}
parts=${PARTS:-cpu dp}
data=()
if [ -n "${DATA:-}" ]; then data=(--data "$DATA"); fi
if [ -z "${JF:-}" ]; then
  CGO_ENABLED=0 go build -o bin/jetfabric ./cmd/jetfabric
  JF=bin/jetfabric
fi
field() { "$py" -c 'import json,sys; d=json.load(sys.stdin); print(" ".join(str(d[k]) for k in sys.argv[1:]))' "$@"; }
echo "host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"

if [[ " $parts " == *" cpu "* ]]; then
  echo "== 1. one step at batch 128 on cores $cores (ms; jetfabric is the run's wall time over its steps)"
  for m in ${MODELS:-mlp cnn}; do
    limit=25600; [ $m = cnn ] && limit=3840
    for r in $(seq "$rounds"); do
      j=$(GOMAXPROCS=2 taskset -c "$cores" "$JF" train "${data[@]}" --model $m --epochs 1 --limit $limit --test-limit 1000 --json --progress 0 2>/dev/null | field step_ms weights_sha256)
      t=$(taskset -c "$cores" "$py" examples/torch/step_time.py $m 2 2>/dev/null | field step_ms)
      "$py" -c 'import sys; j,h,t=sys.argv[1],sys.argv[2],sys.argv[3]; print(f"{sys.argv[4]} round {sys.argv[5]}: jetfabric {float(j):.2f}  pytorch {float(t):.2f}  ratio {float(j)/float(t):.2f}x  weights {h[:12]}")' ${j} ${t} $m $r
    done
  done
fi

if [[ " $parts " == *" dp "* ]]; then
  # Workers of WORKER_CORES cores each on the first cores; with fewer than
  # 4 the broker and the training client get the cores left over.
  wc=${WORKER_CORES:-4}
  pin=()
  if (( 4 * wc < $(nproc) )); then pin=(taskset -c "$((4 * wc))-$(($(nproc) - 1))"); fi
  echo "== 2. data-parallel CNN, 128 examples a worker a step, 40 steps, workers of $wc cores${pin:+ (broker and client on cores $((4 * wc)) up)}, FABRIC_XFER on $xfer"
  store=$(mktemp -d); port=${PORT:-4333}
  "${pin[@]}" "$JF" broker --store "$store" --listen 127.0.0.1:$port --http "" --xfer-storage "$xfer" >"$store/broker.log" 2>&1 &
  pids=($!)
  trap 'kill ${pids[@]} 2>/dev/null; wait 2>/dev/null; rm -rf "$store"' EXIT
  sleep 2
  for i in 0 1 2 3; do
    GOMAXPROCS=$wc taskset -c $((wc*i))-$((wc*i+wc-1)) "$JF" worker --url nats://127.0.0.1:$port --devices cpu-$i --gpus none >"$store/w$i.log" 2>&1 &
    pids+=($!)
  done
  sleep 2
  for r in $(seq "$rounds"); do
    one=$("${pin[@]}" "$JF" train "${data[@]}" --url nats://127.0.0.1:$port --model cnn --devices cpu-0 --batch 128 --epochs 1 --limit 5120 --test-limit 1000 --json --progress 0 2>/dev/null | field samples_per_s step_ms)
    four=$("${pin[@]}" "$JF" train "${data[@]}" --url nats://127.0.0.1:$port --model cnn --devices cpu-0,cpu-1,cpu-2,cpu-3 --batch 512 --epochs 1 --limit 20480 --test-limit 1000 --json --progress 0 2>/dev/null | field samples_per_s step_ms)
    whole=$("${pin[@]}" "$JF" train "${data[@]}" --url nats://127.0.0.1:$port --model cnn --devices cpu-0,cpu-1,cpu-2,cpu-3 --batch 512 --epochs 1 --limit 20480 --test-limit 1000 --json --progress 0 --no-split 2>/dev/null | field samples_per_s step_ms)
    "$py" -c 'import sys; a,b,c,d,e,f=map(float,sys.argv[1:7]); print(f"round {sys.argv[7]}: 1 worker {a:.0f} samples/s ({b:.1f} ms a step), 4 workers {c:.0f} samples/s ({d:.1f} ms a step): {c/a:.2f}x; --no-split {e:.0f} samples/s ({f:.1f} ms a step): {e/a:.2f}x")' $one $four $whole $r
  done
fi
