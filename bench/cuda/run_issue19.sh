#!/usr/bin/env bash
# Issue 19 on the H200 (one device call): the batch-invariant mode (--deterministic). Binaries built
# on the project machine, xz-packed in $P with lib/ (device_prelude.sh).
#   bash run_issue19.sh [stages]   stages: tests, real, cost
#   tests: every test binary's GPU tests (the new ones: CudaGemmInvariant.*, ForwardDevice.
#          Deterministic*, Engine.Deterministic*) and the sanitizers
#   real:  the real SmolLM2 (MODEL, CALIB) through `generate` on the GPU, greedy: 8 prompts at once
#          vs each prompt alone, for fp16 and vecinfer:d4b8, without and with --deterministic;
#          prints how many of the 8 texts equal their solo text
#   cost:  bench e2e --device cuda, decode steps and a prefill, without and with --deterministic
set -uo pipefail
P=${VQ_PREBUILT:-.gpubin-d}
L=${OUT:-out/issue19}
S=$(dirname "$0")
mkdir -p "$L"
stages=${1:-tests,real,cost}
. "$S/device_prelude.sh"
if has tests; then
  gpu_tests
  sanitizers
fi
if has real; then
  MODEL=${MODEL:-/tmp/vqmodel/SmolLM2-135M-Instruct.Q4_1.gguf}
  CALIB=${CALIB:-$(ls ~/.cache/veloxquant/calib/b179c9523d0e6a0f-vecinfer_d4b8-*.vqcal 2>/dev/null | head -1)}
  PR=$L/prompts.txt
  { cat "$S/real_prompts.txt"; echo; for a in 40 300 700; do sed -n "$a,$((a + 9))p" "${TEXT:-/tmp/vqmodel/jargon60k.txt}" | tr '\n\r\t' '   '; echo; done; } | grep -v '^ *$' > $PR
  for kv in fp16 vecinfer:d4b8; do
    for det in "" --deterministic; do
      tag=$(echo "$kv$det" | tr ':,' '__')
      cal=(); [ "$kv" = fp16 ] || cal=(--calib "$CALIB")
      g() { timeout 120 $BIN/veloxquant generate -m "$MODEL" --device cuda --kv-cache $kv --temp 0 -n 64 --ignore-eos -b 64 "${cal[@]}" $det "$@"; }
      g --prompts-file $PR --parallel 8 > $L/batched_$tag.txt 2> $L/batched_$tag.err || tail -3 $L/batched_$tag.err
      : > $L/alone_$tag.txt
      i=0
      while IFS= read -r line; do
        echo "$line" > $L/one.txt
        if [ -n "$det" ]; then  # the engine with this one request
          g --prompts-file $L/one.txt 2>/dev/null | sed "s/^--- sequence 0 /--- sequence $i /" >> $L/alone_$tag.txt
        else  # one prompt alone: generate's single-sequence path
          { echo "--- sequence $i (alone) ---"; g --prompts-file $L/one.txt --no-display-prompt 2>/dev/null; echo; } >> $L/alone_$tag.txt
        fi
        i=$((i + 1))
      done < $PR
      python3 - "$L/batched_$tag.txt" "$L/alone_$tag.txt" "$kv $det" <<'PY'
import re, sys
def seqs(p):
    parts = re.split(r'^--- sequence (\d+) .*---$', open(p, errors='replace').read(), flags=re.M)
    return {int(parts[i]): parts[i + 1].strip() for i in range(1, len(parts), 2)}
b, a = seqs(sys.argv[1]), seqs(sys.argv[2])
same = sum(1 for i in a if b.get(i) == a[i])
print(f"real {sys.argv[3] or '(default)'}: {same} of {len(a)} texts batched == alone" + ("" if same == len(a) else f" (differ: {[i for i in a if b.get(i) != a[i]]})"))
PY
    done
  done
fi
if has cost; then
  for geo in ${GEOS:-qwen2.5-1.5b llama-3.1-8b}; do
    for det in "" --deterministic; do
      timeout 280 $BIN/veloxquant bench e2e --device cuda --geometry $geo --kv-cache fp16 --kv-cache vecinfer:d4b8 \
        --batch 1,8,32 --ctx 4096 --prefill 8192 --steps 24 --warmup 30 $det 2>$L/cost_$geo$det.err | tee $L/cost_$geo$det.txt | grep -E "^\||prefill|device"
    done
  done
fi
