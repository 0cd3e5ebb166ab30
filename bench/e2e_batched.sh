#!/usr/bin/env bash
# Batched decode, ours beside llama.cpp's in one run (docs/BENCHMARKS.md, "Batched decode"):
# veloxquant bench e2e (fp16, q8_0, vecinfer:d4b8, vecinfer:d8b8) and bench/llamacpp_batched.py
# (llama.cpp f16, q8_0, q4_0 with flash attention), same model, threads, batches and contexts.
# Installs llama-cpp-python (built from source) into build/llamacpp-venv on first use.
#   bench/e2e_batched.sh [BATCHES=1,4,8,16] [CTXS=512,4096]   (VQ_THREADS=2, VQ_STEPS=16)
set -euo pipefail
cd "$(dirname "$0")/.."
BATCHES=${1:-1,4,8,16}
CTXS=${2:-512,4096}
T=${VQ_THREADS:-2}
STEPS=${VQ_STEPS:-16}
OUT=${VQ_OUT:-bench/out}
mkdir -p "$OUT"
B=build/release/tools/veloxquant/veloxquant
[ -x "$B" ] || scripts/build.sh release veloxquant
bench/llamacpp_bench.sh --install-only
MODEL=$("$B" info --default-model-path)
echo "date: $(date -u +%FT%TZ); machine: $(lscpu | grep 'Model name' | sed 's/.*: *//') ($(nproc) cores); load: $(uptime | sed 's/.*load average: //')"
"$B" bench e2e --batch "$BATCHES" --ctx "$CTXS" --steps "$STEPS" -t "$T" --kv-cache fp16 --kv-cache q8_0 \
  --kv-cache vecinfer:d4b8 --kv-cache vecinfer:d8b8 --json "$OUT/e2e_batched_ours.json"
build/llamacpp-venv/bin/python bench/llamacpp_batched.py --model "$MODEL" --batch "$BATCHES" --ctx "$CTXS" \
  --steps "$STEPS" --threads "$T" --json "$OUT/e2e_batched_llamacpp.json" 2>/dev/null
echo "load after: $(uptime | sed 's/.*load average: //')"
