#!/usr/bin/env bash
# Device run of the forward-pass ops (CUDA helper 6; docs/CUDA_NOTES.md section 8): build check of
# every CUDA source with the machine's nvcc, all GPU tests of tests/ops, compute-sanitizer memcheck
# and racecheck on a small subset, bench_llm_ops and the attention kernel variants. The lent H200
# has nvcc, cmake and the CUDA libraries (cuBLAS from /usr/local/cuda) but not fmt / Highway /
# GoogleTest, so the binaries are built on the project machine and carried:
#   $P/{test_ops,bench_llm_ops,bench_cuda_ops}  $P/lib/{libfmt.so.9,libhwy.so.1,libcudart.so.13}
#   $P/tree/{src,include,bench/cuda,fmtinc/fmt}  (sources and fmt headers for the build check)
# with P = $VQ_PREBUILT (default .gpubin-cuda, an ignored folder named in the device tool's carry).
#   bench/cuda/run_forward_ops.sh [stages]   stages: comma list of nvcc,tests,sanitize,bench,attn
# Logs go to $OUT (default out/cuda-forward).
set -uo pipefail
P=$PWD/${VQ_PREBUILT:-.gpubin-cuda}
OUT=${OUT:-out/cuda-forward}
stages=${1:-nvcc,tests,sanitize,bench,attn}
has() { [[ ",$stages," == *",$1,"* ]]; }
mkdir -p "$OUT"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem --format=csv
  nvcc --version | tail -2; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
CUB=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do [ -f "$d/libcublas.so.13" ] && CUB=$d && break; done
[ -z "$CUB" ] && CUB=$(dirname "$(find /usr /opt -name 'libcublas.so.13' 2>/dev/null | head -1)")
echo "cublas from $CUB" | tee -a "$OUT/env.txt"
export LD_LIBRARY_PATH=$P/lib:$CUB:${LD_LIBRARY_PATH:-}
NV=""
if has nvcc; then  # objects only, 8 at a time, in the background
  ( cd "$P/tree" && ls src/ops/cuda/*.cu bench/cuda/*.cu | xargs -P 8 -I{} sh -c \
     'timeout 200 nvcc -std=c++17 -O3 -gencode=arch=compute_90,code=sm_90 --expt-relaxed-constexpr -DFMT_HEADER_ONLY -DVQ_HAVE_CUDA=1 -Iinclude -Isrc -Ifmtinc -c {} -o /tmp/$(basename {}).o > /tmp/nvcc_$(basename {}).log 2>&1 && echo "nvcc OK {}" || echo "nvcc FAILED {}"' > "$OUT/nvcc.log" 2>&1 ) &
  NV=$!
fi
if has tests; then
  timeout 140 "$P/test_ops" --gtest_filter='*Cuda*:*cuda*' --gtest_brief=1 > "$OUT/tests.log" 2>&1; s=$?
  echo "tests exit $s: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/tests.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED|Failure" "$OUT/tests.log" | head -30
fi
if has sanitize; then
  small='Types/CudaDequant.*/q4_K:Types/CudaDequant.*/q5_1:Types/CudaEmbedding.*/q6_K:Types/CudaEmbedding.*/bf16:CudaUpload.*:Shapes/CudaGemv.*/q4_K_odd_rows:Shapes/CudaGemv.*/q4_K_smollm_down:Shapes/CudaGemv.*/q8_0_smollm_wk:Shapes/CudaGemv.*/q4_1_smollm_down:Shapes/CudaGemm.*/smollm_m1:Models/CudaRmsNorm.*/smollm2_135m:Models/CudaRope.*/gemma3_270m:Models/CudaGlu.*/smollm2_135m:CudaAddCast.*:CudaGraph.*:Cases/CudaPQAttention.*/d128_d4b8_g8_two_lut_tiles_lut'
  timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 "$P/test_ops" --gtest_filter="$small" --gtest_brief=1 > "$OUT/memcheck.log" 2>&1; s=$?
  echo "memcheck exit $s: $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -1) $(grep -E '^\[  (PASSED|FAILED)' "$OUT/memcheck.log" | tr '\n' ' ')"
  race='Shapes/CudaGemv.*/q4_K_odd_rows:Models/CudaRope.*/smollm2_135m:Cases/CudaPQAttention.*/d128_d4b8_g8_two_lut_tiles_lut'
  timeout 40 compute-sanitizer --tool racecheck --error-exitcode 9 "$P/test_ops" --gtest_filter="$race" --gtest_brief=1 > "$OUT/racecheck.log" 2>&1; s=$?
  echo "racecheck exit $s: $(grep -E 'RACECHECK SUMMARY' "$OUT/racecheck.log" | tail -1)"
fi
if has bench; then timeout 110 "$P/bench_llm_ops" all > "$OUT/bench_llm.log" 2>&1; echo "bench_llm_ops exit $?"; fi
if has attn; then timeout 35 "$P/bench_cuda_ops" attn > "$OUT/bench_attn.log" 2>&1; echo "bench_cuda_ops attn exit $?"; fi
if [ -n "$NV" ]; then
  wait "$NV"; cat /tmp/nvcc_*.log | grep -E "error" | head -5 >> "$OUT/nvcc.log"
  echo "nvcc: $(grep -c 'nvcc OK' "$OUT/nvcc.log") OK, $(grep -c 'nvcc FAILED' "$OUT/nvcc.log") failed"
fi
echo "=== summary"
[ -f "$OUT/bench_llm.log" ] && grep -E "^copy|gemv_summary" "$OUT/bench_llm.log"
[ -f "$OUT/bench_attn.log" ] && grep -E "^attn_variants" "$OUT/bench_attn.log"
exit 0
