#!/usr/bin/env bash
# Data-parallel CNN training, builds against each other on one many-core
# host: for each round and each binary of BINS in turn, a broker and four
# CPU workers of 3 cores (cores 0-11; the broker and the client on 12-15),
# one worker's 40 steps at batch 128, then four workers' 40 steps at 512
# (the backward in two parts, the default), the ratio of their samples/s,
# the weights' hash and the time worker cpu-0's loop stood waiting for
# collectives, and the time its loop was busy with frames (one worker, then
# four, collective waits included; evaluation included in both), and the
# ratio of the steady state (the steps after the first loss check, at step
# 10: graphs defined and recorded) beside the whole run's. With ALONE=1, each round also runs four one-worker
# trainings at once, one on each worker (no collectives): the ratio the
# host itself allows four workers, sharing its memory and caches. With
# PROF=DIR, the broker and the workers write CPU profiles into DIR
# (b-PID.prof, wN-PID.prof), and the four workers' training client too
# (t4-PID.prof). Alternating the builds round by round lets a host whose
# speed drifts weigh on each alike.
# usage: BINS="old/jetfabric new/jetfabric" bench/dp-ab.sh [rounds]
# Environment: DATA (the directory of the four MNIST .gz files; default:
# the GoMNIST module in the Go module cache), BATCH (each worker's share of
# a step, default 128), LIM1 (one worker's examples, default 40 steps). On fewer than 16 cores nothing is pinned.
set -uo pipefail
rounds=${1:-2}
batch=${BATCH:-128}
lim=${LIM1:-$((40 * batch))}
data=()
if [ -n "${DATA:-}" ]; then data=(--data "$DATA"); fi
echo "host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
field() { python3 -c 'import json,sys; d=json.load(sys.stdin); print(" ".join(str(d.get(k, 0)) for k in sys.argv[1:]))' "$@"; }
pin=(taskset -c 12-15)
wpin() { exec taskset -c "$@"; }
if (($(nproc) < 16)); then
  pin=()
  wpin() { shift; exec "$@"; }
fi
metric() { curl -s "127.0.0.1:$1/metrics" | awk -v m="^$2" '$0 ~ m {s+=$2} END{print s+0}'; }
waited() { metric "$1" jetfabric_device_collective_wait_seconds_total; }
busy() { metric "$1" jetfabric_device_exec_seconds_total; }
run_build() { # binary round port
  local jf=$1 port=$3 store
  store=$(mktemp -d)
  JETFABRIC_CPUPROFILE=${PROF:+$PROF/b-%p.prof} "${pin[@]}" "$jf" broker --store "$store" --listen 127.0.0.1:$port --http "" --xfer-storage memory >"$store/broker.log" 2>&1 &
  local pids=($!)
  sleep 1.5
  for i in 0 1 2 3; do
    JETFABRIC_CPUPROFILE=${PROF:+$PROF/w$i-%p.prof} GOMAXPROCS=3 wpin $((3 * i))-$((3 * i + 2)) "$jf" worker --url nats://127.0.0.1:$port --devices cpu-$i --gpus none --metrics 127.0.0.1:$((9190 + i)) >"$store/w$i.log" 2>&1 &
    pids+=($!)
  done
  sleep 1.5
  local one four w0 w1 alone=
  local e0 e1 e2
  e0=$(busy 9190)
  one=$("${pin[@]}" "$jf" train "${data[@]}" --url nats://127.0.0.1:$port --model cnn --devices cpu-0 --batch $batch --epochs 1 --limit "$lim" --test-limit 500 --check-every 10 --json --progress 0 2>"$store/t1.err" | field samples_per_s step_ms steady_samples_per_s steady_step_ms)
  w0=$(waited 9190)
  e1=$(busy 9190)
  four=$(JETFABRIC_CPUPROFILE=${PROF:+$PROF/t4-%p.prof} "${pin[@]}" "$jf" train "${data[@]}" --url nats://127.0.0.1:$port --model cnn --devices cpu-0,cpu-1,cpu-2,cpu-3 --batch $((4 * batch)) --epochs 1 --limit $((4 * lim)) --test-limit 500 --check-every 10 --json --progress 0 2>"$store/t4.err" | field samples_per_s step_ms weights_sha256 steady_samples_per_s steady_step_ms)
  w1=$(waited 9190)
  e2=$(busy 9190)
  if [ "${ALONE:-}" = 1 ]; then
    local i tps=()
    for i in 0 1 2 3; do
      "${pin[@]}" "$jf" train "${data[@]}" --url nats://127.0.0.1:$port --model cnn --devices cpu-$i --batch $batch --epochs 1 --limit "$lim" --test-limit 500 --json --progress 0 2>"$store/a$i.err" >"$store/a$i.json" &
      tps+=($!)
    done
    wait "${tps[@]}"
    alone=$(python3 -c 'import json,sys; r=[json.load(open(f)) for f in sys.argv[2:]]; s=sum(x["samples_per_s"] for x in r); ms=sum(x["step_ms"] for x in r)/len(r); print(f"  four alone at once: {s:.0f}/s in all, {ms:.1f} ms a step, {s/float(sys.argv[1]):.2f}x one")' \
      "${one%% *}" "$store"/a?.json || tail -n 3 "$store"/a?.err)
  fi
  python3 -c '
import sys
a = sys.argv[1:]
one, four = [float(x) for x in a[0:4]], a[4:9]
sps4, ms4, h, ssps4, sms4 = float(four[0]), float(four[1]), four[2], float(four[3]), float(four[4])
w0, w1, jf, rnd, steps, e0, e1, e2 = float(a[9]), float(a[10]), a[11], a[12], float(a[13]), float(a[14]), float(a[15]), float(a[16])
steady = f"; steady (steps 11 on) {one[3]:.1f} / {sms4:.1f} ms, {ssps4/one[2]:.2f}x" if one[2] and ssps4 else ""
print(f"{jf} round {rnd}: one {one[0]:.0f}/s {one[1]:.1f} ms; four {sps4:.0f}/s {ms4:.1f} ms; {sps4/one[0]:.2f}x{steady}; weights {h[:12]}; "
      f"cpu-0 busy {(e1-e0)/steps*1000:.1f} / {(e2-e1)/steps*1000:.1f} ms/step, collective wait {(w1-w0)/steps*1000:.1f} ms/step")' \
    $one $four "$w0" "$w1" "$jf" "$2" $((lim / batch)) "$e0" "$e1" "$e2" ||
    for f in "$store"/*.err "$store"/*.log; do echo "== $f"; tail -n 5 "$f"; done
  [ -z "${alone:-}" ] || echo "$alone"
  kill "${pids[@]}" 2>/dev/null
  wait 2>/dev/null
  rm -rf "$store"
}
for r in $(seq "$rounds"); do
  p=4400
  for b in ${BINS:?set BINS to the binaries to compare}; do
    run_build "$b" "$r" $p
    p=$((p + 1))
  done
done
