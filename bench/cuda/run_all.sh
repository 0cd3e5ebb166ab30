#!/usr/bin/env bash
# Builds, checks and times the CUDA backend on a GPU machine in one go (H200: docs/BENCHMARKS.md).
#   bench/cuda/run_all.sh [stages]   stages: comma list of nvcc,tests,sanitize,bench,torch,ncu
#   (default: all but ncu; ncu profiles the default LUT kernel at B=8, S=32768)
# Binaries: a normal CMake build (build/gpu) when the project's dependencies are installed;
# otherwise prebuilt binaries from $VQ_PREBUILT (default .gpubin: test_ops, bench_cuda_ops, lib/),
# and the CUDA sources are still compiled there with nvcc as a build check ("nvcc" stage).
# Logs go to $OUT (default out/cuda).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out/cuda}
mkdir -p "$OUT"
stages=${1:-nvcc,tests,sanitize,bench,torch}
has() { [[ ",$stages," == *",$1,"* ]]; }
export PYTHONUNBUFFERED=1

{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  nvcc --version | tail -2; date -u; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

BIN=""
if cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release >"$OUT/cmake.log" 2>&1 &&
   ninja -C build/gpu test_ops bench_cuda_ops >>"$OUT/cmake.log" 2>&1; then
  BIN=build/gpu
  TEST_OPS=$BIN/tests/test_ops TEST_KV=$BIN/tests/test_kvcache BENCH=$BIN/bench/cuda/bench_cuda_ops
else
  PRE=${VQ_PREBUILT:-.gpubin}
  echo "CMake build unavailable here (see cmake.log); using prebuilt binaries from $PRE"
  TEST_OPS=$PRE/test_ops TEST_KV=$PRE/test_kvcache BENCH=$PRE/bench_cuda_ops
  export LD_LIBRARY_PATH=$PWD/$PRE/lib:${LD_LIBRARY_PATH:-}
  if has nvcc; then
    # Build check of every CUDA source with this machine's nvcc (objects only), in the background.
    ( for f in src/ops/cuda/*.cu bench/cuda/*.cu; do
        nvcc -std=c++17 -O3 -gencode=arch=compute_90,code=sm_90 -gencode=arch=compute_90,code=compute_90 \
          --expt-relaxed-constexpr -lineinfo -Xptxas -v -DFMT_HEADER_ONLY -DVQ_HAVE_CUDA=1 -Iinclude -Isrc -I"$PRE/include" \
          -c "$f" -o /tmp/$(basename "$f").o > "/tmp/nvcc_$(basename "$f").log" 2>&1 && echo "nvcc OK $f" || echo "nvcc FAILED $f"
      done > "$OUT/nvcc.log" 2>&1; cat /tmp/nvcc_*.log >> "$OUT/nvcc.log" ) &
    NVCC_PID=$!
  fi
fi

rc=0
if has tests; then
  "$TEST_OPS" --gtest_filter='*cuda*:*Cuda*' --gtest_brief=1 2>&1 | tee "$OUT/tests.log" | tail -25
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  # The device pool (KVDevice::cuda) against the CPU store, plus the CPU cache tests.
  "$TEST_KV" --gtest_filter='DeviceStore.*:VecInfer.*:-VecInfer.CalibrationFileRoundTrip' --gtest_brief=1 2>&1 | tee "$OUT/tests_kvcache.log" | tail -8
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi
if has sanitize; then
  small='Cases/CudaPQAttention.*/d64_k_d8b8per_v_d4b8_g1*:Cases/CudaPQAttention.*/prefill_chunk_d128_g4*:Cases/CudaPQAttention.*/d128_d4b4_per_g3*:Cases/CudaPQAttention.*/d64_d4b8per_keys_g4_prefill*:Cases/CudaPQAttention.*/d128_d4b8_g8_two_lut_tiles*:Cases/CudaFusedEncode.*/d64_s4_b6_shared_one_token:Cases/CudaFusedEncode.*/d96_s16*:Cases/CudaDecodeCodes.*/d64_s8_b12_per:Backends/PQParity.*/cuda_d8_b8_per:Backends/PQParity.*/cuda_d5_generic_per:Cases/CudaEncodeMma.*/d8_k256_ragged:Cases/CudaEncodeMma.*/d4_k256_ragged'
  for tool in memcheck racecheck; do
    compute-sanitizer --tool $tool --error-exitcode 9 "$TEST_OPS" --gtest_filter="$small" --gtest_brief=1 \
      > "$OUT/sanitize_$tool.log" 2>&1
    s=$?
    echo "compute-sanitizer $tool: exit $s; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize_$tool.log" | tail -1)"
    [ $s -eq 0 ] || rc=1
  done
  compute-sanitizer --tool memcheck --error-exitcode 9 "$TEST_KV" --gtest_filter='DeviceStore.*' --gtest_brief=1 \
    > "$OUT/sanitize_memcheck_kvcache.log" 2>&1
  s=$?
  echo "compute-sanitizer memcheck (GPU cache): exit $s; $(grep -E 'ERROR SUMMARY' "$OUT/sanitize_memcheck_kvcache.log" | tail -1)"
  [ $s -eq 0 ] || rc=1
fi
if has bench; then
  "$BENCH" all 2>&1 | tee "$OUT/bench.log"
fi
if has torch; then
  python3 bench/cuda/torch_peers.py all 2>&1 | tee "$OUT/torch.log"
fi
if has ncu; then
  VQ_BENCH_ONLY=8,32768 timeout 150 ncu --clock-control none --kernel-name-base mangled \
    -k regex:lut_split_kernelILi32ELi128ELb1 -c 1 --section SpeedOfLight --section WarpStateStats \
    --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy "$BENCH" attn > "$OUT/ncu_lut_v4_b8_s32768.txt" 2>&1
  echo "ncu: exit $?"; grep -E "Duration|L1/TEX Cache Throughput|DRAM Throughput|Compute \(SM\)|Issued Warp|Eligible|Stall" "$OUT/ncu_lut_v4_b8_s32768.txt" | head -12
fi
if [ -n "${NVCC_PID:-}" ]; then wait "$NVCC_PID"; grep -E "^nvcc " "$OUT/nvcc.log"; fi
exit $rc
