#!/usr/bin/env bash
# Device run of the GPU runtime (issues 9 and 10): the device KV store and forward tests, the
# existing CUDA op tests, compute-sanitizer on a small model, the paged attention and end-to-end
# benchmarks with their PyTorch / HF transformers peers, and the real-model acceptance.
# The lent H200 lacks fmt / Highway / GoogleTest, so binaries are built on the project machine
# and carried in $P (default .gpubin-gpu, an ignored folder named in the device tool's carry):
#   $P/{test_kvcache,test_model,test_ops,veloxquant,bench_paged_attention}.gz (gzip: the carry limit)
#   $P/lib/{libfmt.so.9,libhwy.so.1,libcudart.so.13}  $P/{torch_peers.py,hf_peer.py}
#   bench/cuda/run_device_runtime.sh [stages]   stages: comma list of
#     tests, ops, sanitize, e2e_small, e2e, attn, peers, hf, real
# Logs go to $OUT/logs.tgz (the device tool returns at most 8 files; default out/device-runtime).
set -uo pipefail
P=$PWD/${VQ_PREBUILT:-.gpubin-gpu}
FINAL=${OUT:-out/device-runtime}
OUT=/tmp/vqlogs
mkdir -p "$FINAL"
trap 'tar czf "$FINAL/logs.tgz" -C "$OUT" . 2>/dev/null' EXIT
stages=${1:-tests,ops,sanitize,e2e_small}
has() { [[ ",$stages," == *",$1,"* ]]; }
mkdir -p "$OUT"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem --format=csv
  nvcc --version | tail -1; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
CUB=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do [ -f "$d/libcublas.so.13" ] && CUB=$d && break; done
[ -z "$CUB" ] && CUB=$(dirname "$(find /usr /opt -name 'libcublas.so.13' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$P/lib:$CUB:${LD_LIBRARY_PATH:-}
BIN=/tmp/vqbin
mkdir -p $BIN
for f in "$P"/*.gz; do b=$BIN/$(basename "$f" .gz); gunzip -c "$f" > "$b" && chmod +x "$b"; done
summary() { echo "$1 exit $2: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$3" | tr '\n' ' ')"; grep -E "^\[  FAILED|Failure|error:|Error" "$3" | head -${4:-25}; }
if has tests; then
  timeout 240 "$BIN/test_kvcache" --gtest_filter='*DeviceStore*' --gtest_brief=1 > "$OUT/test_kvcache.log" 2>&1
  summary test_kvcache $? "$OUT/test_kvcache.log"
  timeout 240 "$BIN/test_model" --gtest_filter='*ForwardDevice*' --gtest_brief=1 > "$OUT/test_model.log" 2>&1
  summary test_model $? "$OUT/test_model.log"
fi
if has ops; then
  timeout 150 "$BIN/test_ops" --gtest_filter='*Cuda*:*cuda*' --gtest_brief=1 > "$OUT/test_ops.log" 2>&1
  summary test_ops $? "$OUT/test_ops.log" 10
fi
if has sanitize; then
  f='Cases/DeviceStoreParity.*/fp16_g3_d64:Cases/DeviceStoreParity.*/d4b8_shared_g3_d64_lut:Cases/DeviceStoreParity.*/d4b8_sub_g4_d128:Cases/DeviceStoreParity.*/d8b12_sub_g1_d64:Cases/DeviceStoreParity.*/d4b8_window'
  timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/test_kvcache" --gtest_filter="$f" --gtest_brief=1 > "$OUT/memcheck_store.log" 2>&1
  echo "memcheck store exit $?: $(grep -E 'ERROR SUMMARY' "$OUT/memcheck_store.log" | tail -1)"
  timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/test_model" --gtest_filter='Cases/ForwardDeviceParity.*/d64_q8_0_vecinfer*:ForwardDevice.PoolBudget*' --gtest_brief=1 > "$OUT/memcheck_model.log" 2>&1
  echo "memcheck model exit $?: $(grep -E 'ERROR SUMMARY' "$OUT/memcheck_model.log" | tail -1)"
  timeout 150 compute-sanitizer --tool racecheck --error-exitcode 9 "$BIN/test_kvcache" --gtest_filter='DeviceStore.SmallRunForSanitizers' --gtest_brief=1 > "$OUT/racecheck.log" 2>&1
  echo "racecheck exit $?: $(grep -E 'RACECHECK SUMMARY' "$OUT/racecheck.log" | tail -1)"
fi
if has e2e_small; then
  timeout 120 "$BIN/veloxquant" bench e2e --device cuda --geometry smollm2-135m --batch 1,8 --ctx 4096 \
    --kv-cache fp16 --kv-cache vecinfer:d4b8 --steps 32 > "$OUT/e2e_small.log" 2>&1
  echo "e2e smollm exit $?"; cat "$OUT/e2e_small.log" | tail -12
  timeout 200 "$BIN/veloxquant" bench e2e --device cuda --geometry llama-3.1-8b --batch 1,8 --ctx 4096,32768 \
    --kv-cache fp16 --kv-cache vecinfer:d4b8,gran=shared --steps 16 --warmup 34 > "$OUT/e2e_llama_small.log" 2>&1
  echo "e2e llama exit $?"; tail -12 "$OUT/e2e_llama_small.log"
fi
if has attn; then
  timeout 240 "$BIN/bench_paged_attention" all > "$OUT/paged_attn.log" 2>&1; echo "paged attention exit $?"
  grep -E "paged_attn" "$OUT/paged_attn.log" | tail -60
fi
if has peers; then
  timeout 200 python3 "$P/torch_peers.py" attn10 > "$OUT/torch_attn10.log" 2>&1; echo "torch attn10 exit $?"
  cat "$OUT/torch_attn10.log"
fi
if has e2e; then
  timeout 420 "$BIN/veloxquant" bench e2e --device cuda --geometry llama-3.1-8b --batch 1,8,32 --ctx 4096,32768,131072 \
    --kv-cache fp16 --kv-cache vecinfer:d4b8 --kv-cache vecinfer:d8b8 --steps 16 --warmup 34 --prefill 4096,32768 \
    --json "$OUT/e2e_llama.json" > "$OUT/e2e_llama.log" 2>&1
  echo "e2e llama exit $?"; cat "$OUT/e2e_llama.log"
  timeout 200 "$BIN/veloxquant" bench e2e --device cuda --geometry falcon3-7b --batch 1,8 --ctx 32768 \
    --kv-cache fp16 --kv-cache vecinfer:d4b8 --steps 16 --warmup 34 > "$OUT/e2e_falcon.log" 2>&1
  echo "e2e falcon exit $?"; cat "$OUT/e2e_falcon.log"
fi
if has hf; then
  PYTHONUNBUFFERED=1 timeout 420 python3 "$P/hf_peer.py" 4096 32768 > "$OUT/hf_peer.log" 2>&1; echo "hf peer exit $?"
  grep -E "hf_peer|Error|error" "$OUT/hf_peer.log" | tail -8
fi
if has real; then  # the real SmolLM2 model, carried in parts: $P/model/part.*
  M=/tmp/smollm2.gguf; cat "$P"/model/part.* > $M; sha256sum $M | tee "$OUT/model_sha.txt"
  for dev in cpu cuda; do
    timeout 200 "$BIN/veloxquant" perplexity -m $M --text "$P/model/ppl.txt" -c 512 --chunk 64 --device $dev --no-reference \
      > "$OUT/ppl_$dev.log" 2>&1; echo "perplexity $dev exit $?: $(grep -E 'perplexity' "$OUT/ppl_$dev.log" | head -1)"
    timeout 100 "$BIN/veloxquant" generate -m $M -p "The capital of France is" -n 48 --temp 0 --device $dev \
      > "$OUT/gen_$dev.log" 2>&1; echo "generate $dev exit $?"
  done
  cmp "$OUT/gen_cpu.log" "$OUT/gen_cuda.log" && echo "greedy text equal" || diff "$OUT/gen_cpu.log" "$OUT/gen_cuda.log" | head
fi
exit 0
