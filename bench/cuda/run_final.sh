#!/usr/bin/env bash
# Release check of main on the H200 (one device call): the GPU tests of every test binary and the
# end-to-end decode rows of the merged tree. Binaries built on the project machine (nvcc, sm_90 +
# PTX), xz-packed in $P (an ignored folder the device tool carries): $P/{test_ops,test_kvcache,
# test_model,test_engine,veloxquant}.xz and $P/lib/{libfmt.so.9,libhwy.so.1,libxxhash.so.0,libcudart.so.13}.
#   bash bench/cuda/run_final.sh [stages]   stages: tests, sanitize, e2e
set -uo pipefail
P=${VQ_PREBUILT:-.gpubin-final}
L=${OUT:-out/final}
mkdir -p "$L"
stages=${1:-tests,e2e}
. "$(dirname "$0")/device_prelude.sh"
if has tests; then
  gpu_tests
fi
if has sanitize; then
  timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 $BIN/test_model --gtest_filter='ForwardDevice.BatchedStepsEqualSingleSteps' --gtest_brief=1 > $L/memcheck_model.log 2>&1
  echo "memcheck forward exit $?: $(grep -E 'ERROR SUMMARY' $L/memcheck_model.log | tail -1)"
fi
if has e2e; then
  timeout 120 $BIN/veloxquant bench e2e --device cuda --geometry llama-3.1-8b --batch 1,8 --ctx 4096,32768 \
    --kv-cache fp16 --kv-cache vecinfer:d4b8 --steps 16 > $L/e2e_llama.log 2>&1; echo "e2e llama exit $?"; grep -E "^\|" $L/e2e_llama.log
  timeout 120 $BIN/veloxquant bench e2e --device cuda --geometry falcon3-7b --batch 1,8 --ctx 32768 \
    --kv-cache fp16 --kv-cache vecinfer:d4b8,gran=shared --steps 16 > $L/e2e_falcon.log 2>&1; echo "e2e falcon exit $?"; grep -E "^\|" $L/e2e_falcon.log
  # errors the device path must give as one line
  $BIN/veloxquant bench e2e --device cuda --geometry llama-3.1-8b --batch 1 --ctx 4096 --kv-cache q4_0 > $L/refuse.log 2>&1; echo "q4_0 on device exit $? : $(tail -1 $L/refuse.log)"
fi
