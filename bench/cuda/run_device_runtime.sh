#!/usr/bin/env bash
# Device run of the GPU runtime (issues 9 and 10): the device KV store and forward tests, the
# existing CUDA op tests, compute-sanitizer on a small model, the paged attention and end-to-end
# benchmarks with their PyTorch / HF transformers peers, and the real-model acceptance.
# The lent H200 lacks fmt / Highway / GoogleTest, so binaries are built on the project machine
# and carried in $P (default .gpubin-gpu, an ignored folder named in the device tool's carry):
#   $P/{test_kvcache,test_model,test_ops,veloxquant,bench_paged_attention}.xz (xz: the carry limit; a later
#   call on the warm machine reuses the unpacked /tmp/vqbin)
#   $P/lib/{libfmt.so.9,libhwy.so.1,libcudart.so.13}  $P/{torch_peers.py,hf_peer.py}
#   bench/cuda/run_device_runtime.sh [stages]   stages: comma list of
#     tests, ops, sanitize, e2e_small, e2e, attn, ncu, peers, hf, stash (model parts to /tmp), real
# Logs go to $OUT/logs.tgz (the device tool returns at most 8 files; default out/device-runtime).
set -uo pipefail
P=$PWD/${VQ_PREBUILT:-.gpubin-gpu}
FINAL=${OUT:-out/device-runtime}
OUT=/tmp/vqlogs
mkdir -p "$FINAL"
save() { tar czf "$FINAL/logs.tgz" -C "$OUT" . 2>/dev/null; }  # after every stage: a killed call still returns logs
trap save EXIT
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
for f in "$P"/*.xz; do
  [ -e "$f" ] || continue
  b=$BIN/$(basename "$f" .xz)
  { xz -dc "$f" 2>/dev/null || python3 -c "import lzma,sys; sys.stdout.buffer.write(lzma.open(sys.argv[1]).read())" "$f"; } > "$b"
  chmod +x "$b"
done
summary() { echo "$1 exit $2: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$3" | tr '\n' ' ')"; grep -E "^\[  FAILED|Failure|error:|Error" "$3" | head -${4:-25}; }
if has tests; then
  timeout 240 "$BIN/test_kvcache" --gtest_filter='*DeviceStore*' --gtest_brief=1 > "$OUT/test_kvcache.log" 2>&1
  summary test_kvcache $? "$OUT/test_kvcache.log"
  timeout 240 "$BIN/test_model" --gtest_filter='*ForwardDevice*' --gtest_brief=1 > "$OUT/test_model.log" 2>&1
  summary test_model $? "$OUT/test_model.log"
fi
save
if has ops; then
  timeout 150 "$BIN/test_ops" --gtest_filter='*Cuda*:*cuda*' --gtest_brief=1 > "$OUT/test_ops.log" 2>&1
  summary test_ops $? "$OUT/test_ops.log" 10
fi
save
if has sanitize; then
  f='Cases/DeviceStoreParity.*/fp16_g3_d64:Cases/DeviceStoreParity.*/d4b8_shared_g3_d64_lut:Cases/DeviceStoreParity.*/d4b8_r32_g4_d128:Cases/DeviceStoreParity.*/d8b12_r32_g2_d64:Cases/DeviceStoreParity.*/d4b8_window'
  timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/test_kvcache" --gtest_filter="$f" --gtest_brief=1 > "$OUT/memcheck_store.log" 2>&1
  echo "memcheck store exit $?: $(grep -E 'ERROR SUMMARY' "$OUT/memcheck_store.log" | tail -1)"
  timeout 150 compute-sanitizer --tool racecheck --error-exitcode 9 "$BIN/test_kvcache" --gtest_filter='DeviceStore.SmallRunForSanitizers' --gtest_brief=1 > "$OUT/racecheck.log" 2>&1
  echo "racecheck exit $?: $(grep -E 'RACECHECK SUMMARY' "$OUT/racecheck.log" | tail -1)"
fi
save
if has e2e_small; then
  timeout 120 "$BIN/veloxquant" bench e2e --device cuda --geometry smollm2-135m --batch 1,8 --ctx 4096 \
    --kv-cache fp16 --kv-cache vecinfer:d4b8 --steps 32 > "$OUT/e2e_small.log" 2>&1
  echo "e2e smollm exit $?"; cat "$OUT/e2e_small.log" | tail -12
  timeout 200 "$BIN/veloxquant" bench e2e --device cuda --geometry llama-3.1-8b --batch 1,8 --ctx 4096,32768 \
    --kv-cache fp16 --kv-cache vecinfer:d4b8,gran=shared --steps 16 --warmup 34 > "$OUT/e2e_llama_small.log" 2>&1
  echo "e2e llama exit $?"; tail -12 "$OUT/e2e_llama_small.log"
fi
save
if has attn; then
  timeout 200 "$BIN/bench_paged_attention" all > "$OUT/paged_attn.log" 2>&1; echo "paged attention exit $?"
  grep -E "paged_attn" "$OUT/paged_attn.log" | tail -60
fi
save
if has ncu; then
  for kv in vecinfer:d4b8 fp16; do
    timeout 90 ncu --clock-control none --kernel-name regex:'lut_split|split_kernel|dense_split' --launch-skip 5 --launch-count 1 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats \
      "$BIN/bench_paged_attention" llama "$kv" --B 8 --S 32768 > "$OUT/ncu_${kv//[:,=]/_}.log" 2>&1
    echo "ncu $kv exit $?"; grep -E "Duration|Memory Throughput|DRAM Throughput|L1/TEX Cache Throughput|Compute \(SM\)|Warp Cycles Per Issued|Issued Warp|No Eligible|Registers Per|Achieved Occupancy|Stall" "$OUT/ncu_${kv//[:,=]/_}.log" | head -16
  done
fi
save
if has peers; then
  timeout 200 python3 "$P/torch_peers.py" attn10 > "$OUT/torch_attn10.log" 2>&1; echo "torch attn10 exit $?"
  cat "$OUT/torch_attn10.log"
fi
save
if has e2e; then
  timeout 300 "$BIN/veloxquant" bench e2e --device cuda --geometry llama-3.1-8b --batch 1,8,32 --ctx 4096,32768,131072 \
    --kv-cache fp16 --kv-cache vecinfer:d4b8 --kv-cache vecinfer:d8b8 --steps 16 --warmup 34 --prefill 4096,32768 \
    --json "$OUT/e2e_llama.json" > "$OUT/e2e_llama.log" 2>&1
  echo "e2e llama exit $?"; cat "$OUT/e2e_llama.log"
  VQ_GEMV_F16=0 timeout 60 "$BIN/veloxquant" bench e2e --device cuda --geometry llama-3.1-8b --batch 1 --ctx 4096 \
    --kv-cache fp16 --kv-cache vecinfer:d4b8 --steps 16 --warmup 34 > "$OUT/e2e_llama_cublas.log" 2>&1
  echo "e2e llama (cuBLAS at m=1) exit $?"; grep -E "^\|" "$OUT/e2e_llama_cublas.log" | tail -2
  VQ_PREFILL_KERNEL=0 timeout 60 "$BIN/veloxquant" bench e2e --device cuda --geometry llama-3.1-8b --batch 1 --ctx 4096 \
    --kv-cache vecinfer:d4b8 --steps 4 --warmup 4 --prefill 4096 > "$OUT/e2e_llama_rowwise_prefill.log" 2>&1
  echo "e2e llama (row-wise prefill) exit $?"; grep -E "prefill" "$OUT/e2e_llama_rowwise_prefill.log" | tail -2
  timeout 120 "$BIN/veloxquant" bench e2e --device cuda --geometry falcon3-7b --batch 1,8 --ctx 32768 \
    --kv-cache fp16 --kv-cache vecinfer:d4b8 --steps 16 --warmup 34 > "$OUT/e2e_falcon.log" 2>&1
  echo "e2e falcon exit $?"; grep -E "^\|" "$OUT/e2e_falcon.log"
  timeout 60 "$BIN/veloxquant" bench e2e --device cuda --geometry smollm2-135m --batch 1,8 --ctx 4096 \
    --kv-cache fp16 --kv-cache vecinfer:d4b8 --steps 32 > "$OUT/e2e_smollm.log" 2>&1
  echo "e2e smollm exit $?"; grep -E "^\|" "$OUT/e2e_smollm.log"
fi
save
if has e2e_final; then
  timeout 150 "$BIN/veloxquant" bench e2e --device cuda --geometry llama-3.1-8b --batch 1,8,32 --ctx 4096,32768 \
    --kv-cache fp16 --kv-cache vecinfer:d4b8 --steps 16 --warmup 34 > "$OUT/e2e_final_a.log" 2>&1
  echo "e2e final a exit $?"; grep -E "^\|" "$OUT/e2e_final_a.log"
  timeout 150 "$BIN/veloxquant" bench e2e --device cuda --geometry llama-3.1-8b --batch 1,8 --ctx 131072 \
    --kv-cache vecinfer:d4b8 --kv-cache vecinfer:d4b8,gran=shared --steps 16 --warmup 34 > "$OUT/e2e_final_b.log" 2>&1
  echo "e2e final b exit $?"; grep -E "^\|" "$OUT/e2e_final_b.log"
  timeout 60 "$BIN/bench_paged_attention" llama fp16 vecinfer:d4b8 --B 8 --S 32768 > "$OUT/paged_attn_final.log" 2>&1
  grep paged_attn "$OUT/paged_attn_final.log"
fi
save
if has hf; then
  PYTHONUNBUFFERED=1 HF_MODES=${HF_MODES:-static} timeout 300 python3 "$P/hf_peer.py" 4096 32768 > "$OUT/hf_peer.log" 2>&1; echo "hf peer exit $?"
  grep -E "hf_peer|Error|error" "$OUT/hf_peer.log" | tail -8
fi
save
if has stash; then mkdir -p /tmp/vqmodel && cp "$P"/model/part.* /tmp/vqmodel/ && ls -la /tmp/vqmodel; fi
if has real; then  # the real SmolLM2 model, carried in two parts over two calls (the carry limit)
  mkdir -p /tmp/vqmodel; cp "$P"/model/part.* /tmp/vqmodel/ 2>/dev/null
  M=/tmp/smollm2.gguf; cat /tmp/vqmodel/part.* > $M; sha256sum $M | tee "$OUT/model_sha.txt"
  T=$(ls "$P"/model/*.txt /tmp/vqmodel/*.txt 2>/dev/null | head -1)
  for dev in cpu cuda; do
    timeout 200 "$BIN/veloxquant" perplexity -m $M --text "$T" -c 512 --chunk 64 --windows 4 --device $dev \
      --kv-cache fp16 --no-reference > "$OUT/ppl_$dev.log" 2>&1; echo "perplexity fp16 $dev exit $?: $(grep -E 'perplexity' "$OUT/ppl_$dev.log" | head -1)"
    timeout 100 "$BIN/veloxquant" generate -m $M -p "The capital of France is" -n 48 --temp 0 --device $dev \
      > "$OUT/gen_$dev.log" 2>&1; echo "generate $dev exit $?"
  done
  cmp "$OUT/gen_cpu.log" "$OUT/gen_cuda.log" && echo "greedy text equal (fp16 cache)" || diff "$OUT/gen_cpu.log" "$OUT/gen_cuda.log" | head
  head -c 600 "$OUT/gen_cuda.log"; echo
  C=$(ls "$P"/model/*.vqcal /tmp/vqmodel/*.vqcal 2>/dev/null | head -1)
  if [ -n "$C" ]; then
    for dev in cpu cuda; do
      timeout 200 "$BIN/veloxquant" perplexity -m $M --text "$T" -c 512 --chunk 64 --windows 4 --device $dev \
        --kv-cache vecinfer:d4b8,gran=shared --calib "$C" --no-reference > "$OUT/ppl_vq_$dev.log" 2>&1
      echo "perplexity vecinfer:d4b8 $dev exit $?: $(grep -E 'perplexity' "$OUT/ppl_vq_$dev.log" | head -1)"
      timeout 100 "$BIN/veloxquant" generate -m $M -p "The capital of France is" -n 48 --temp 0 --device $dev \
        --kv-cache vecinfer:d4b8,r=32,gran=shared --calib "$C" > "$OUT/gen_vq_$dev.log" 2>&1; echo "generate vecinfer $dev exit $?"
    done
    cmp "$OUT/gen_vq_cpu.log" "$OUT/gen_vq_cuda.log" && echo "greedy text equal (vecinfer:d4b8,r=32)" || diff "$OUT/gen_vq_cpu.log" "$OUT/gen_vq_cuda.log" | head
    timeout 120 "$BIN/veloxquant" calibrate -m $M --text "$T" --kv-cache vecinfer:d4b8,gran=shared --tokens 2048 --device cuda -o /tmp/dev.vqcal > "$OUT/calib_cuda.log" 2>&1
    echo "calibrate cuda exit $?: $(tail -1 "$OUT/calib_cuda.log")"
    timeout 100 "$BIN/veloxquant" perplexity -m $M --text "$T" -c 512 --chunk 64 --windows 4 --device cuda \
      --kv-cache vecinfer:d4b8,gran=shared --calib /tmp/dev.vqcal --no-reference > "$OUT/ppl_vq_devcal.log" 2>&1
    echo "perplexity vecinfer:d4b8 (device calibration) exit $?: $(grep -E 'perplexity' "$OUT/ppl_vq_devcal.log" | head -1)"
  fi
fi
save
exit 0
