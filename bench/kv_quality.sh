#!/usr/bin/env bash
# KV-cache quality and speed table (docs/BENCHMARKS.md, "KV caches: quality and speed").
# SmolLM2-135M-Instruct, evaluation text from python3-doc (held out: calibration uses the
# Jargon File), context CTX (default 2048): perplexity, KL and top-1 vs fp16 per method; then
# end-to-end decode tokens/s at contexts 512 / 4096 / 8192 from bench/kv_speed.sh.
# usage: bench/kv_quality.sh [BUILD_DIR=build/release] [CTX=2048]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build/release}
CTX=${2:-2048}
BIN=$BUILD/tools/veloxquant/veloxquant
TEXT=${VQ_EVAL_TEXT:-/usr/share/doc/python3/html/_sources/tutorial/classes.rst.txt}
OUT=${VQ_OUT:-bench/out}
mkdir -p "$OUT"
METHODS=${VQ_METHODS:-"fp16 q8_0 q4_0 kivi4 kivi2 vecinfer:d4b8 vecinfer:d8b12 vecinfer:d8b8 vecinfer:k=d4b8,v=d8b8"}
echo "date: $(date -u +%F) machine: $(lscpu | grep 'Model name' | sed 's/.*: *//') ($(nproc) cores)"
for m in $METHODS; do
  f="$OUT/ppl_$(echo "$m" | tr ':,=' '___').json"
  "$BIN" perplexity --text "$TEXT" --kv-cache "$m" -c "$CTX" --json > "$f"
  python3 - "$f" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
print(f"| {j['kv_cache']} | {j['perplexity']:.3f} | {100*(j['perplexity']/j['fp16_perplexity']-1):+.2f}% | "
      f"{j['kl_vs_fp16']:.4f} | {100*j['top1_agreement_vs_fp16']:.1f}% | {j['bits_per_element']:.2f} |")
PY
done
bench/kv_speed.sh "$BUILD" "$OUT/calib"
