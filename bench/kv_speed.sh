#!/usr/bin/env bash
# End-to-end decode tokens/s of SmolLM2-135M with every KV cache at contexts 512 / 4096 / 8192
# (docs/BENCHMARKS.md, "KV caches: quality and speed", speed table); the caches hold
# the model's real K/V of the text (veloxquant bench e2e --batch 1, tools/veloxquant/bench_e2e.cpp).
# usage: bench/kv_speed.sh [BUILD_DIR=build/release] [CALIB_DIR=bench/out/calib]
#   CALIB_DIR holds calib_<preset>.vqcal for the vecinfer presets (made when absent by
#   veloxquant calibrate: 2048 tokens of the Jargon File, 4096 for d8b12).
# VQ_THREADS (default 2), VQ_STEPS (24), VQ_CTX (512,4096,8192).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build/release}
CAL=${2:-bench/out/calib}
OUT=${VQ_OUT:-bench/out}
CTX=${VQ_CTX:-512,4096,8192}
STEPS=${VQ_STEPS:-24}
mkdir -p "$OUT" "$CAL"
B="$BUILD/tools/veloxquant/veloxquant"
echo "date: $(date -u +%FT%TZ) machine: $(lscpu | grep 'Model name' | sed 's/.*: *//') ($(nproc) cores); load: $(uptime | sed 's/.*load average: //')"
run() { "$B" bench e2e --batch 1 --ctx "$CTX" --steps "$STEPS" -t "${VQ_THREADS:-2}" "$@"; }
for spec in fp16 q8_0 q4_0 kivi4 kivi2; do run --kv-cache "$spec" --json "$OUT/speed_${spec}_t${VQ_THREADS:-2}.json"; done
for p in d4b8 d8b8 k=d4b8,v=d8b8 d8b12; do
  f="$CAL/calib_$(echo "$p" | tr '=,' '__').vqcal"
  if [ ! -f "$f" ]; then
    n=2048; [ "$p" = d8b12 ] && n=4096
    "$B" calibrate --text /usr/share/doc/jargon-text/jargon.txt.gz --tokens $n --kv-cache "vecinfer:$p" -o "$f" > /dev/null 2>&1
  fi
  run --kv-cache "vecinfer:$p" --calib "$f" --json "$OUT/speed_$(echo "$p" | tr '=,' '__')_t${VQ_THREADS:-2}.json"
done
echo "load after: $(uptime | sed 's/.*load average: //')"
