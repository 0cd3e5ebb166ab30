#!/usr/bin/env bash
# Long context: `veloxquant generate -c 32768` with a ~30k-token prompt for each KV cache, under
# /usr/bin/time -v (max RSS), printing KV bytes per token (docs/BENCHMARKS.md, KV caches, long
# context table). Slow: a 30k-token prefill takes 10-60 minutes on 2 cores.
# usage: bench/kv_speed_long.sh [BUILD_DIR=build/release] [CALIB_DIR=bench/out/calib] [METHOD...]
#   default methods: fp16 vecinfer:d4b8; vecinfer:P uses CALIB_DIR/calib_P.vqcal (bench/kv_speed.sh makes them).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build/release}
CAL=${2:-bench/out/calib}
shift 2 2>/dev/null || shift $#
METHODS=${*:-"fp16 vecinfer:d4b8"}
OUT=${VQ_OUT:-bench/out}
mkdir -p "$OUT"
PROMPT="$OUT/prompt30k.txt"
# The first 110 kB of three python3-doc library pages: 29,782 tokens for SmolLM2.
D=/usr/share/doc/python3/html/_sources/library
cat "$D/os.rst.txt" "$D/stdtypes.rst.txt" "$D/functions.rst.txt" | head -c 110000 > "$PROMPT"
for m in $METHODS; do
  tag=$(echo "$m" | tr ':,=' '___')
  extra=()
  case "$m" in vecinfer:*) extra=(--calib "$CAL/calib_$(echo "${m#vecinfer:}" | tr '=,' '__').vqcal") ;; esac
  /usr/bin/time -v "$BUILD/tools/veloxquant/veloxquant" generate -f "$PROMPT" -c 32768 -n 32 -t 2 --temp 0 \
    --ignore-eos -q --kv-cache "$m" "${extra[@]}" --stats-json "$OUT/long_$tag.json" > "$OUT/long_$tag.log" 2>&1
  python3 - "$OUT/long_$tag.json" "$OUT/long_$tag.log" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
rss = [l for l in open(sys.argv[2]) if 'Maximum resident' in l][0].split(':')[1].strip()
n = j['n_prompt'] + j['n_decoded']
print(f"| {j['kv_cache']} | {j['n_prompt']} | {j['kv_bytes']/1048576:.1f} | {j['kv_bytes']/n:,.0f} | "
      f"{int(rss)/1024:.0f} | {j['prefill_s']:.0f} s | {j['decode_tps']:.1f} |")
PY
done
