#!/usr/bin/env bash
# Where a decode step's time goes, and the real model on the device against the CPU (issue 9).
# Binaries built here, xz-packed in $P (as run_final.sh); the model in two parts over two calls.
#   bash bench/cuda/run_decode_profile.sh [stages]
#   stages: tests    the GPU tests of test_ops, test_kvcache, test_model (and test_engine's)
#           sanitize memcheck and racecheck on the batched device forward test
#           pdl      end-to-end rows and attention alone with VQ_PDL=0 and 1 (same binaries)
#           table    issue 9's end-to-end table (Llama-3.1-8B fp16 / d4b8 with prefill, Falcon3-7B)
#           table2   d8b8 rows and the HF transformers peer (static cache, compiled)
#           attn     issue 10's attention table + prefill chunk alone + the torch peers
#           fork     end-to-end rows and attention alone with VQ_ATTN_FORK=0 and 1
#           gemv     bench_gemv_f16: the fp16 GEMV variants alone and as the 32-layer chain
#           profile  ncu (one metric: gpu__time_duration) over one graph-replayed decode step
#                    (VQ_PROFILE_STEP marks it) per row, summed per kernel, beside the step time
#           prefill  the prefill chunk alone (512 queries vs 32K, Llama; Falcon D=256) for each
#                    variant of the prefill kernel (VQ_PREFILL_WARPS=4, 8), the torch peers (each
#                    SDPA backend), and ncu sections of the d4b8 prefill kernel
#           quant    bench_cuda_ops quant (the encoders' table) and ncu sections of the tensor-core
#                    encoder at S=8192, D=128
#           e2epre   end-to-end prefill rows (Llama-3.1-8B geometry, fp16 and d4b8, 4K and 32K
#                    prompts) and the HF transformers peer's prefill in the same call
#           sanpre   memcheck and racecheck on DeviceStore.SmallRunForSanitizers (the prefill kernel's
#                    dense and coded passes, every decode attention kernel, the block encoder)
#           sass     opcode counts of the tensor-core encoder's kernels (cuobjdump -sass on the device)
#           attnprof per-kernel times of the decode attention sequence (Llama d4b8 shared, B=1 S=32K
#                    and B=8 S=128K) and ncu sections with stall sampling of its LUT split kernel
#           lut2     the LUT split kernel as one 16-warp block per SM (VQ_LUT_BLOCKS=1) and as two
#                    8-warp blocks (=2): the GPU tests under =2, then Llama d4b8 attention for both
#           e2edec   decode step rows (Llama-3.1-8B geometry, B=1 and 8 at 4K and 32K, fp16 and d4b8;
#                    d4b8 again with VQ_FUSE_QUERY_TRANSFORM=0) and the HF transformers peer
#           final    A/B of the fused query transform (VQ_FUSE_QUERY_TRANSFORM=1/0, twice) on the
#                    attention alone and end to end, fp16 and Falcon3 attention, the torch peers; the
#                    GPU tests' summaries again at the end (stage tests must run first)
#           stash    copy $M1/part.* (this call's part of the model) to /root/vqmodel
#           real     join the parts (+ $M2/part.*), then per prompt of real_prompts.txt: greedy
#                    generation on cpu and cuda with --dump-logits, compared by compare_dumps.py;
#                    perplexity fp16 / vecinfer:d4b8 on both
set -uo pipefail
P=${VQ_PREBUILT:-.gpubin-final}
L=${OUT:-out/profile}
mkdir -p "$L"
stages=${1:-profile}
. "$(dirname "$0")/device_prelude.sh"
HERE=$(dirname "$0")
if has profile; then
  for row in "llama-3.1-8b vecinfer:d4b8 4096 1" "llama-3.1-8b vecinfer:d4b8 32768 1" "llama-3.1-8b fp16 4096 1" \
             "llama-3.1-8b vecinfer:d4b8 131072 8"; do
    set -- $row
    tag=$1_$2_$3_$4
    timeout 100 $BIN/veloxquant bench e2e --device cuda --geometry $1 --batch $4 --ctx $3 --kv-cache $2 --steps 16 \
      > $L/e2e_$tag.log 2>&1
    echo "step: $(grep -E '^\| (fp16|vec)' $L/e2e_$tag.log)"
    VQ_PROFILE_STEP=1 timeout 200 ncu --clock-control none --cache-control none --profile-from-start off \
      --metrics gpu__time_duration.sum --csv $BIN/veloxquant bench e2e --device cuda --geometry $1 --batch $4 --ctx $3 \
      --kv-cache $2 --steps 3 --warmup 2 > $L/ncu_$tag.csv 2> $L/ncu_$tag.err
    echo "ncu exit $?"
    python3 $HERE/ncu_times.py "$L/ncu_$tag.csv" --sum
  done
fi
if has tests; then
  gpu_tests
fi
# sanitize_tests TAG BINARY FILTER: memcheck and racecheck over one gtest filter
sanitize_tests() {
  for tool in memcheck racecheck; do
    timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 $BIN/$2 --gtest_filter="$3" --gtest_brief=1 \
      > $L/${tool}_$1.log 2>&1
    echo "$tool $1 exit $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $L/${tool}_$1.log | tail -1)"
  done
}
if has sanitize; then sanitize_tests model test_model 'ForwardDevice.BatchedStepsEqualSingleSteps'; fi
if has pdl; then  # the forward chain with and without programmatic dependent launch, same binary
  for pdl in 0 1; do
    VQ_PDL=$pdl timeout 150 $BIN/veloxquant bench e2e --device cuda --geometry llama-3.1-8b --batch 1,8 --ctx 4096,32768 \
      --kv-cache fp16 --kv-cache vecinfer:d4b8 --steps 16 > $L/pdl${pdl}_llama.log 2>&1; echo "VQ_PDL=$pdl llama exit $?"
    grep -E '^\| (fp16|vec)' $L/pdl${pdl}_llama.log
    VQ_PDL=$pdl timeout 120 $BIN/veloxquant bench e2e --device cuda --geometry llama-3.1-8b --batch 1,8 --ctx 131072 \
      --kv-cache vecinfer:d4b8 --steps 16 > $L/pdl${pdl}_llama128.log 2>&1; echo "VQ_PDL=$pdl llama 128K exit $?"
    grep -E '^\| (fp16|vec)' $L/pdl${pdl}_llama128.log
    VQ_PDL=$pdl timeout 120 $BIN/veloxquant bench e2e --device cuda --geometry falcon3-7b --batch 1,8 --ctx 32768 \
      --kv-cache vecinfer:d4b8,gran=shared --steps 16 > $L/pdl${pdl}_falcon.log 2>&1; echo "VQ_PDL=$pdl falcon exit $?"
    grep -E '^\| (fp16|vec)' $L/pdl${pdl}_falcon.log
    for kv in vecinfer:d4b8,gran=shared fp16; do for S in 4096 32768; do
      VQ_PDL=$pdl timeout 60 $BIN/bench_paged_attention llama $kv --B 1 --S $S > $L/pdl${pdl}_attn_${kv%%:*}_$S.log 2>&1
      echo "VQ_PDL=$pdl attention B=1 S=$S: $(grep paged_attn $L/pdl${pdl}_attn_${kv%%:*}_$S.log | head -2 | tr '\n' ' ')"
    done; done
  done
fi
if has gemv; then
  timeout 200 $BIN/bench_gemv_f16 > $L/gemv.log 2>&1; echo "bench_gemv_f16 exit $?"
  grep -E '^(copy|gemv_chain)' $L/gemv.log
  grep -E '^gemv_alone' $L/gemv.log | awk '{print $2, $5, $6, $8, $9}'
fi
if has fork; then  # the dense split kernel on its own graph branch (default) or after the coded kernel
  for fork in 0 1; do
    VQ_ATTN_FORK=$fork timeout 150 $BIN/veloxquant bench e2e --device cuda --geometry llama-3.1-8b --batch 1,8 \
      --ctx 4096,32768 --kv-cache vecinfer:d4b8 --steps 16 > $L/fork${fork}_llama.log 2>&1; echo "VQ_ATTN_FORK=$fork llama exit $?"
    grep -E '^\| (fp16|vec)' $L/fork${fork}_llama.log
    for S in 4096 32768; do
      VQ_ATTN_FORK=$fork timeout 60 $BIN/bench_paged_attention llama vecinfer:d4b8,gran=shared --B 1 --S $S > $L/fork${fork}_attn_$S.log 2>&1
      echo "VQ_ATTN_FORK=$fork attention B=1 S=$S: $(grep paged_attn $L/fork${fork}_attn_$S.log | head -1)"
    done
  done
fi
if has table; then  # issue 9's table: Llama-3.1-8B geometry (fp16, d4b8), then Falcon3-7B
  for kv in fp16 vecinfer:d4b8; do
    timeout 240 $BIN/veloxquant bench e2e --device cuda --geometry llama-3.1-8b --batch 1,8,32 --ctx 4096,32768,131072 \
      --kv-cache $kv --prefill 4096,32768 --steps 16 --json $L/table_${kv##*:}.json > $L/table_${kv##*:}.log 2>&1
    echo "table $kv exit $?"; grep -E '^\| (fp16|vec)' $L/table_${kv##*:}.log
  done
  timeout 150 $BIN/veloxquant bench e2e --device cuda --geometry falcon3-7b --batch 1,8 --ctx 32768 --kv-cache fp16 \
    --kv-cache vecinfer:d4b8,gran=shared --kv-cache vecinfer:d4b8 --steps 16 > $L/table_falcon.log 2>&1
  echo "falcon exit $?"; grep -E '^\| (fp16|vec)' $L/table_falcon.log
fi
if has table2; then  # d8b8 rows, then the HF transformers peer (static cache, compiled) in the same call
  timeout 150 $BIN/veloxquant bench e2e --device cuda --geometry llama-3.1-8b --batch 1,8 --ctx 32768,131072 \
    --kv-cache vecinfer:d8b8 --steps 16 > $L/table_d8b8.log 2>&1
  echo "table d8b8 exit $?"; grep -E '^\| (fp16|vec)' $L/table_d8b8.log
  PYTHONUNBUFFERED=1 HF_MODES=${HF_MODES:-static} timeout 240 python3 $HERE/hf_peer.py 4096 32768 > $L/hf_peer.log 2>&1
  echo "hf peer exit $?"; grep -E "hf_peer|Error|error" $L/hf_peer.log | tail -8
fi
if has attn; then  # issue 10's table with the torch peers in the same call, and the prefill chunk alone
  for g in llama falcon; do
    timeout 120 $BIN/bench_paged_attention $g fp16 vecinfer:d4b8,gran=shared vecinfer:d4b8 > $L/attn_$g.log 2>&1
    echo "attention $g exit $?"; grep -E '^paged_attn' $L/attn_$g.log
  done
  for kv in fp16 vecinfer:d4b8,gran=shared vecinfer:d4b8; do
    timeout 60 $BIN/bench_paged_attention llama $kv --S 32768 --prefill 512 > $L/prefill_${kv##*:}.log 2>&1
    echo "prefill $kv exit $?: $(grep -E '^paged_prefill|error' $L/prefill_${kv##*:}.log)"
  done
  VQ_PEER_GEO= timeout 200 python3 $HERE/torch_peers.py attn10 > $L/torch_attn10.log 2>&1; echo "torch exit $?"
  grep -E 'torch_attn10|torch_prefill' $L/torch_attn10.log
fi
if has prefill; then
  for v in ${PREFILL_VARIANTS:-4:32 8:32 4:64 8:64}; do
    w=${v%:*}; keys=${v#*:}
    if [ "$v" = auto ]; then unset VQ_PREFILL_WARPS VQ_PREFILL_KEYS; else export VQ_PREFILL_WARPS=$w VQ_PREFILL_KEYS=$keys; fi
    for kv in fp16 vecinfer:d4b8,gran=shared vecinfer:d4b8 vecinfer:d8b8,gran=shared; do
      timeout 60 $BIN/bench_paged_attention llama $kv --S 32768 --prefill 512 > $L/prefill.log 2>&1
      echo "W=$w keys=$keys $(grep -E '^paged_prefill|error' $L/prefill.log) exit $?"
    done
    for kv in vecinfer:d4b8,gran=shared fp16; do
      timeout 60 $BIN/bench_paged_attention falcon $kv --S 32768 --prefill 512 > $L/prefill.log 2>&1
      echo "W=$w keys=$keys $(grep -E '^paged_prefill|error' $L/prefill.log)"
    done
    if [ -n "${PREFILL_TESTS:-}" ]; then
      timeout 200 $BIN/test_kvcache --gtest_filter='*DeviceStore*:VecInferGpu.*' --gtest_brief=1 > $L/tk_${w}_${keys}.log 2>&1
      summary "W=$w keys=$keys test_kvcache" $? $L/tk_${w}_${keys}.log
      timeout 200 $BIN/test_model --gtest_filter='*Device*' --gtest_brief=1 > $L/tm_${w}_${keys}.log 2>&1
      summary "W=$w keys=$keys test_model" $? $L/tm_${w}_${keys}.log
    fi
    unset VQ_PREFILL_WARPS VQ_PREFILL_KEYS
  done
  timeout 120 python3 $HERE/torch_peers.py prefill > $L/torch_prefill.log 2>&1; echo "torch exit $?"
  grep -E 'torch_prefill' $L/torch_prefill.log
  for kv in vecinfer:d4b8,gran=shared fp16; do
    timeout 120 ncu --kernel-name regex:prefill_kernel --launch-count 1 --launch-skip 2 \
      --section SpeedOfLight --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis \
      --section LaunchStats --section MemoryWorkloadAnalysis $BIN/bench_paged_attention llama $kv --S 32768 --prefill 512 \
      > $L/ncu_prefill_${kv##*:}.txt 2>&1; echo "ncu prefill $kv exit $?"
    grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Issue Slots Busy|Executed Ipc A|Registers Per|Block Limit|Stall|L1/TEX Hit|DRAM Throughput|Warp Cycles Per Issued" \
      $L/ncu_prefill_${kv##*:}.txt | head -24
  done
fi
if has quant; then
  timeout 120 $BIN/bench_cuda_ops quant > $L/quant.log 2>&1; echo "quant exit $?"; grep -E "^quant" $L/quant.log | tail -20
  VQ_BENCH_QUANT_S=8192 timeout 120 ncu --kernel-name regex:encode_mma_kernel --launch-skip 20 --launch-count 1 --section SpeedOfLight \
    --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis --section LaunchStats \
    --section InstructionStats --metrics smsp__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,smsp__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,smsp__inst_executed_pipe_tensor.avg.pct_of_peak_sustained_active,smsp__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,smsp__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_selected_per_issue_active.ratio,launch__grid_size \
    $BIN/bench_cuda_ops quant > $L/ncu_quant.txt 2>&1; echo "ncu quant exit $?"
  grep -E "Duration|Compute \(SM\) Throughput|Issue Slots Busy|Executed Ipc A|Achieved Occupancy|Warp Cycles Per Issued|Registers Per|Grid Size|pipe_|stalled|grid_size" $L/ncu_quant.txt | head -30
fi
if has e2epre; then
  for kv in fp16 vecinfer:d4b8; do
    timeout 200 $BIN/veloxquant bench e2e --device cuda --geometry llama-3.1-8b --batch 1 --ctx 4096 --kv-cache $kv \
      --prefill 4096,32768 --steps 4 > $L/e2epre_${kv##*:}.log 2>&1; echo "e2e prefill $kv exit $?"
    grep -iE '^\| (fp16|vec)|prefill' $L/e2epre_${kv##*:}.log | head -8
  done
  PYTHONUNBUFFERED=1 HF_MODES=${HF_MODES:-static} timeout 240 python3 $HERE/hf_peer.py 4096 32768 > $L/hf_peer.log 2>&1
  echo "hf peer exit $?"; grep -E "hf_peer|Error|error" $L/hf_peer.log | tail -8
fi
if has sanpre; then sanitize_tests store test_kvcache 'DeviceStore.SmallRunForSanitizers'; fi
if has sass; then
  CUOBJ=$(command -v cuobjdump || ls /usr/local/cuda*/bin/cuobjdump 2>/dev/null | head -1)
  $CUOBJ -sass $BIN/bench_cuda_ops > $L/sass_bench_cuda_ops.txt 2>&1; echo "cuobjdump exit $?"
  python3 - $L/sass_bench_cuda_ops.txt <<'PY'
import re, sys, collections
fn, counts = None, collections.defaultdict(collections.Counter)
for line in open(sys.argv[1], errors="replace"):
    m = re.search(r"Function : (\S+)", line)
    if m: fn = m.group(1); continue
    m = re.search(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", line)
    if fn and "encode_mma_kernel" in fn and m: counts[fn][m.group(1).split(".")[0]] += 1
for fn, c in counts.items():
    if "ILi8ELi32E" not in fn: continue  # sub_dim 8, 256 centroids
    keys = ["HMMA", "LOP3", "FMNMX", "IMNMX", "VIMNMX", "VIMNMX3", "FADD", "LDS", "SHFL"]
    print(fn[:90], " ".join(f"{k}={c[k]}" for k in keys if c[k]), "total", sum(c.values()))
PY
fi
if has attnprof; then
  for shape in ${ATTNPROF_SHAPES:-1:4096 1:32768 8:131072}; do
    set -- ${shape%:*} ${shape#*:}
    timeout 120 ncu --cache-control none --clock-control none --metrics gpu__time_duration.sum \
      --kernel-name regex:"query_transform|lut_split|dense_split|paged_merge" --launch-skip 8 --launch-count 8 --csv \
      $BIN/bench_paged_attention llama \
      vecinfer:d4b8,gran=shared --B $1 --S $2 > $L/attnprof_$1_$2.csv 2>&1; echo "ncu times B=$1 S=$2 exit $?"
    python3 $HERE/ncu_times.py $L/attnprof_$1_$2.csv
    timeout 120 ncu --kernel-name regex:lut_split --launch-skip 5 --launch-count 1 --import-source no \
      --metrics smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio,smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio,smsp__average_warps_issue_stalled_membar_per_issue_active.ratio,smsp__average_warps_issue_stalled_sleeping_per_issue_active.ratio,smsp__average_warps_issue_stalled_branch_resolving_per_issue_active.ratio \
      --section SpeedOfLight \
      --section Occupancy --section WarpStateStats --section SourceCounters --section LaunchStats --section MemoryWorkloadAnalysis \
      $BIN/bench_paged_attention llama vecinfer:d4b8,gran=shared --B $1 --S $2 > $L/attnncu_$1_$2.txt 2>&1; echo "ncu lut B=$1 S=$2 exit $?"
    grep -E "Duration|Compute \(SM\) Throughput|DRAM Throughput|Issue Slots Busy|Executed Ipc A|Achieved Occupancy|Warp Cycles Per Issued|Grid Size|Registers Per|Dynamic Shared|stalled" $L/attnncu_$1_$2.txt | head -30
  done
fi
if has lut2; then
  export VQ_LUT_BLOCKS=2
  timeout 150 $BIN/test_ops --gtest_filter='*Cuda*:*cuda*' --gtest_brief=1 > $L/lut2_test_ops.log 2>&1; summary "lut2 test_ops" $? $L/lut2_test_ops.log
  timeout 200 $BIN/test_kvcache --gtest_filter='*DeviceStore*:VecInferGpu.*' --gtest_brief=1 > $L/lut2_test_kvcache.log 2>&1; summary "lut2 test_kvcache" $? $L/lut2_test_kvcache.log
  timeout 200 $BIN/test_model --gtest_filter='*Device*' --gtest_brief=1 > $L/lut2_test_model.log 2>&1; summary "lut2 test_model" $? $L/lut2_test_model.log
  for v in 1 2 1 2; do
    VQ_LUT_BLOCKS=$v timeout 120 $BIN/bench_paged_attention llama vecinfer:d4b8,gran=shared > $L/lut2_attn_$v.log 2>&1
    echo "VQ_LUT_BLOCKS=$v exit $?"; grep -E '^paged_attn' $L/lut2_attn_$v.log | awk '{print $4, $5, $7}' | tr '\n' ' '; echo
  done
  unset VQ_LUT_BLOCKS
fi
if has e2edec; then
  timeout 200 $BIN/veloxquant bench e2e --device cuda --geometry llama-3.1-8b --batch 1,8 --ctx 4096,32768 \
    --kv-cache fp16 --kv-cache vecinfer:d4b8 --steps 16 > $L/e2edec.log 2>&1; echo "e2e decode exit $?"
  grep -E '^\| (fp16|vec)' $L/e2edec.log
  VQ_FUSE_QUERY_TRANSFORM=0 timeout 200 $BIN/veloxquant bench e2e --device cuda --geometry llama-3.1-8b --batch 1,8 \
    --ctx 4096,32768 --kv-cache vecinfer:d4b8 --steps 16 > $L/e2edec_nofuse.log 2>&1; echo "e2e decode (no fused transform) exit $?"
  grep -E '^\| (fp16|vec)' $L/e2edec_nofuse.log
  timeout 120 $BIN/veloxquant bench e2e --device cuda --geometry llama-3.1-8b --batch 1,8 --ctx 131072 \
    --kv-cache vecinfer:d4b8 --steps 16 > $L/e2edec128.log 2>&1; echo "e2e decode 128K exit $?"
  grep -E '^\| (fp16|vec)' $L/e2edec128.log
  PYTHONUNBUFFERED=1 HF_MODES=${HF_MODES:-static} timeout 240 python3 $HERE/hf_peer.py 4096 32768 > $L/hf_peer.log 2>&1
  echo "hf peer exit $?"; grep -E "hf_peer|Error|error" $L/hf_peer.log | tail -8
fi
if has final; then
  short() { grep -E '^paged_attn' "$1" | awk '{split($3,k,"="); split($6,g,"="); printf "%s/%s/%s=%s ", k[2], $4, $5, g[2]}'; echo; }
  for f in 1 0 1 0; do
    VQ_FUSE_QUERY_TRANSFORM=$f timeout 90 $BIN/bench_paged_attention llama vecinfer:d4b8,gran=shared > $L/fin_attn_$f.log 2>&1
    echo "fuse=$f: $(short $L/fin_attn_$f.log)"
  done
  timeout 90 $BIN/bench_paged_attention llama fp16 > $L/fin_attn_fp16.log 2>&1; echo "fp16: $(short $L/fin_attn_fp16.log)"
  timeout 90 $BIN/bench_paged_attention falcon vecinfer:d4b8,gran=shared > $L/fin_attn_falcon.log 2>&1; echo "falcon: $(short $L/fin_attn_falcon.log)"
  for f in 1 0; do
    VQ_FUSE_QUERY_TRANSFORM=$f timeout 200 $BIN/veloxquant bench e2e --device cuda --geometry llama-3.1-8b --batch 1,8 \
      --ctx 4096,32768 --kv-cache vecinfer:d4b8 --steps 16 > $L/fin_e2e_$f.log 2>&1
    echo "e2e fuse=$f: $(grep -E '^\| vec' $L/fin_e2e_$f.log | awk -F'|' '{printf "%s/%s=%s ", $3, $4, $5}')"
  done
  VQ_PEER_GEO= timeout 200 python3 $HERE/torch_peers.py attn10 > $L/fin_torch.log 2>&1; echo "torch exit $?"
  grep -E 'torch_attn10' $L/fin_torch.log | awk '{print $2, $3, $4, $5}' | tr '\n' ';'; echo
  for t in test_ops test_kvcache test_model test_engine; do [ -f $L/$t.log ] && summary $t - $L/$t.log; done
fi
if has stash; then mkdir -p /root/vqmodel && cp "${M1:-.gpubin-m1}"/part.* /root/vqmodel/ && ls -la /root/vqmodel; fi
if has real; then
  mkdir -p /root/vqmodel; cp "${M2:-.gpubin-m2}"/* /root/vqmodel/ 2>/dev/null
  M=/root/smollm2.gguf; cat /root/vqmodel/part.* > $M; sha256sum $M | tee "$L/model_sha.txt"
  T=/root/vqmodel/text.txt; C=/root/vqmodel/d4b8_shared.vqcal
  i=0
  while IFS= read -r prompt; do
    i=$((i + 1))
    for kv in fp16 vecinfer:d4b8,gran=shared; do
      ca=""; [ "$kv" = fp16 ] || ca="--calib $C"
      for dev in cpu cuda; do
        timeout 60 $BIN/veloxquant generate -m $M -p "$prompt" -n 48 --temp 0 --ignore-eos --device $dev --kv-cache $kv $ca \
          --dump-logits $L/dump_${i}_${kv%%,*}_$dev.bin > $L/gen_${i}_${kv%%,*}_$dev.log 2>&1 || echo "generate $dev exit $?"
      done
      echo "prompt $i ($kv): $(python3 $HERE/compare_dumps.py $L/dump_${i}_${kv%%,*}_cpu.bin $L/dump_${i}_${kv%%,*}_cuda.bin)"
    done
  done < "$HERE/real_prompts.txt"
  rm -f $L/dump_*.bin
  for dev in cpu cuda; do
    timeout 200 $BIN/veloxquant perplexity -m $M --text "$T" -c 512 --chunk 64 --windows 4 --device $dev --kv-cache fp16 \
      --no-reference > $L/ppl_$dev.log 2>&1; echo "perplexity fp16 $dev exit $?: $(grep -E 'perplexity' $L/ppl_$dev.log | head -1)"
  done
fi
exit 0
