#!/usr/bin/env bash
# Issue 18 on the H200: the learned key transform's device kernels (keys mapped by M in the block
# encoder, queries by M^-T in the query transform). Binaries built on the project machine,
# xz-packed in $P with lib/ (device_prelude.sh); data (a calibration, texts) in $Q.
#   bash run_issue18.sh [stages]   stages: tests, cost, stash, real, passkey
#   tests:   the GPU tests (DeviceStoreParity's learned cases, LearnedKeys.*) and the sanitizers
#   cost:    bench e2e --device cuda --key-transform both: decode steps and a prefill with random
#            Walsh-Hadamard vs random learned calibrations, same call
#   stash:   copies the carried model part(s) $MPART into /root/vqm (the model travels in parts)
#   real:    the parts joined and checked (SHA256 $MSHA); perplexity on the device with the carried
#            calibration (CPU numbers: docs/BENCHMARKS.md) and with one calibrated on the device
#   passkey: `veloxquant eval --device cuda` pass-key retrieval, fp16 and vecinfer:d4b8, contexts
#            4096 and 8192, 5 depths x 12 prompts
set -uo pipefail
P=${VQ_PREBUILT:-.gpubin-d}
Q=${VQ_DATA:-.gpubin-q18}
L=${OUT:-out/issue18}
S=$(dirname "$0")
mkdir -p "$L"
stages=${1:-tests,cost}
M=/root/vqm/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf  # the file name calibrations record
CAL=$Q/q15_d4b8_learned.vqcal
has() { [[ ",$stages," == *",$1,"* ]]; }
if has stash; then
  mkdir -p /root/vqm && cp ${MPART:-.mparts}/part.* /root/vqm/ && ls /root/vqm | wc -l && du -sh /root/vqm
  exit 0
fi
. "$S/device_prelude.sh"
if has tests; then
  timeout 250 $BIN/test_kvcache --gtest_filter='*DeviceStore*:LearnedKeys.*:VecInferGpu.*:GpuSwitch.*:KeyMean*' --gtest_brief=1 \
    > $L/test_kvcache.log 2>&1; summary test_kvcache $? $L/test_kvcache.log
  timeout 150 $BIN/test_ops --gtest_filter='*Cuda*:*cuda*' --gtest_brief=1 > $L/test_ops.log 2>&1; summary test_ops $? $L/test_ops.log
  timeout 200 $BIN/test_model --gtest_filter='*Device*' --gtest_brief=1 > $L/test_model.log 2>&1; summary test_model $? $L/test_model.log
  timeout 150 $BIN/test_engine --gtest_filter='*OnTheDevice*:*OnEachDevice*' --gtest_brief=1 > $L/test_engine.log 2>&1; summary test_engine $? $L/test_engine.log
  sanitizers
fi
if has cost; then
  for geo in ${GEOS:-qwen2.5-1.5b llama-3.1-8b}; do
    timeout 250 $BIN/veloxquant bench e2e --device cuda --geometry $geo --kv-cache vecinfer:d4b8 --key-transform both \
      --key-mean rotated --batch 1,8,32 --ctx 32768 --prefill 32768 --steps 24 --warmup 30 2>$L/cost_$geo.err \
      | tee $L/cost_$geo.txt | grep -E "^\|"
  done
fi
if has real; then
  if [ ! -f $M ]; then cat /root/vqm/part.* > $M && rm -f /root/vqm/part.*; fi
  echo "model sha256: $(sha256sum $M | cut -c1-16) (want ${MSHA:-?})"
  T=$Q/classes.rst.txt
  for ctx in 2048 8192; do
    timeout 200 $BIN/veloxquant perplexity -m $M --text $T --kv-cache vecinfer:d4b8 --calib $CAL -c $ctx --chunk 256 \
      --json --device cuda > $L/ppl_$ctx.json 2> $L/ppl_$ctx.err; echo "perplexity ctx $ctx exit $?: $(tr -d '\n ' < $L/ppl_$ctx.json | head -c 600)"
  done
  timeout 200 $BIN/veloxquant calibrate -m $M --text $Q/jargon.txt.gz --tokens 8192 --kv-cache vecinfer:d4b8 --device cuda \
    --held-out 0 -o /root/vqm/devcal.vqcal > $L/devcal.log 2>&1; echo "calibrate on the device exit $?: $(tail -c 300 $L/devcal.log | tr '\r\n' '  ')"
  timeout 200 $BIN/veloxquant perplexity -m $M --text $T --kv-cache vecinfer:d4b8 --calib /root/vqm/devcal.vqcal -c 2048 \
    --chunk 256 --json --device cuda > $L/ppl_devcal.json 2> $L/ppl_devcal.err; echo "perplexity (device calibration) exit $?: $(tr -d '\n ' < $L/ppl_devcal.json | head -c 600)"
fi
if has passkey; then
  timeout 500 $BIN/veloxquant eval -m $M --device cuda --kv-cache fp16 --kv-cache vecinfer:d4b8 --calib vecinfer:d4b8=$CAL \
    --no-quality --retrieval-ctx 4096 8192 --depths 0 0.25 0.5 0.75 1 --trials ${TRIALS:-12} \
    --retrieval-text $Q/logging-cookbook.rst.txt -o $L/passkey.json 2> $L/passkey.err
  echo "eval exit $?: $(tail -2 $L/passkey.err)"
  python3 - $L/passkey.json <<'PY'
import json, sys, collections
d = json.load(open(sys.argv[1]))
agg = collections.defaultdict(lambda: [0, 0, 0])
for r in d["retrieval"]:
    a = agg[(r["kv_cache"], r["n_ctx"])]
    a[0] += r["correct"]; a[1] += r["trials"]; a[2] += r.get("agree_ref", 0)
for (kv, ctx), (c, t, ag) in sorted(agg.items()):
    print(f"passkey {kv} ctx {ctx}: {c}/{t} correct, {ag}/{t} same answer as fp16")
PY
fi
