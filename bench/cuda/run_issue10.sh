#!/usr/bin/env bash
# Issue 10 device run (run 15+): prebuilt binaries carried in $P (default .gpubin-gpu/r15, an
# ignored folder of the checkout the device tool sends): $P/{test_ops,test_kvcache,bench_cuda_ops,
# bench_paged_attention}.xz and $P/lib/{libfmt.so.9,libhwy.so.1,libcudart.so.13}.
#   bash $P/run_issue10.sh [stages]   stages: tests, decode, attn, quant, sanitize
#   (copy bench/cuda/device_prelude.sh into $P beside it: the script sources it from its own folder)
set -uo pipefail
P=${VQ_PREBUILT:-$(cd "$(dirname "$0")" && pwd)}
FINAL=${OUT:-out/issue10}
L=/tmp/vqlogs
mkdir -p "$FINAL" "$L"
save() { tar czf "$FINAL/logs.tgz" -C "$L" . 2>/dev/null; }
trap save EXIT
stages=${1:-tests,decode}
. "$(dirname "$0")/device_prelude.sh"  # carried beside this script in $P
if has tests; then
  timeout 150 $BIN/test_ops --gtest_filter='*Cuda*:*cuda*' --gtest_brief=1 > $L/test_ops.log 2>&1; summary test_ops $? $L/test_ops.log
  timeout 200 $BIN/test_kvcache --gtest_filter='*DeviceStore*:VecInferGpu.*' --gtest_brief=1 > $L/test_kvcache.log 2>&1; summary test_kvcache $? $L/test_kvcache.log
fi
save
if has sanitize; then
  timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 $BIN/test_ops --gtest_filter="${SAN_FILTER:-*CudaDecodeCodes*:*d256_d4b8_g3_lut*}" --gtest_brief=1 > $L/memcheck.log 2>&1
  echo "memcheck ops exit $?: $(grep -E 'ERROR SUMMARY' $L/memcheck.log | tail -1)"
  timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 $BIN/test_kvcache --gtest_filter='*DeviceStoreParity*d256_lut*' --gtest_brief=1 > $L/memcheck_store.log 2>&1
  echo "memcheck store exit $?: $(grep -E 'ERROR SUMMARY' $L/memcheck_store.log | tail -1)"
  timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 $BIN/test_ops --gtest_filter='*d256_d4b8_g3_lut_lut*' --gtest_brief=1 > $L/racecheck.log 2>&1
  echo "racecheck exit $?: $(grep -E 'RACECHECK SUMMARY' $L/racecheck.log | tail -1)"
fi
save
if has peers; then VQ_PEER_GEO=${VQ_PEER_GEO:-falcon} timeout 120 python3 $P/torch_peers.py attn10 > $L/torch_attn10.log 2>&1; echo "torch exit $?"; grep torch_attn10 $L/torch_attn10.log; fi
save
if has decode; then timeout 120 $BIN/bench_cuda_ops decode > $L/decode.log 2>&1; echo "decode exit $?"; grep -E "^copy|^decode" $L/decode.log; fi
save
if has quant; then timeout 120 $BIN/bench_cuda_ops quant > $L/quant.log 2>&1; echo "quant exit $?"; grep -E "^quant" $L/quant.log | tail -20; fi
save
if has ncu; then  # the LUT split kernel at head_dim 256 (Falcon3, B=8, S=32K)
  timeout 90 ncu --clock-control none --kernel-name regex:'lut_split' --launch-skip 5 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats --section SchedulerStats \
    $BIN/bench_paged_attention falcon vecinfer:d4b8,gran=shared --B 8 --S 32768 > $L/ncu_lut_d256.log 2>&1
  echo "ncu exit $?"; grep -E "Duration|Memory Throughput|DRAM Throughput|L1/TEX Cache Throughput|Compute \(SM\) Throughput|Warp Cycles Per Issued|Issued Warp|No Eligible|Registers Per|Achieved Occupancy|Dynamic Shared" $L/ncu_lut_d256.log | head -16
fi
save
if has attn; then  # d4b8 shared books: the automatic kernel choice, then the gather-mma kernel (the old D=256 path)
  KV=${ATTN_KV:-vecinfer:d4b8,gran=shared}
  for g in ${ATTN_GEOMS:-falcon llama}; do
    timeout 60 $BIN/bench_paged_attention $g $KV > $L/paged_${g}_auto.log 2>&1; echo "paged $g auto exit $?"; grep paged_attn $L/paged_${g}_auto.log
    VQ_CODED_ATTN_KERNEL=gather_mma timeout 60 $BIN/bench_paged_attention $g $KV > $L/paged_${g}_gather.log 2>&1; echo "paged $g gather_mma exit $?"; grep paged_attn $L/paged_${g}_gather.log
  done
fi
save
