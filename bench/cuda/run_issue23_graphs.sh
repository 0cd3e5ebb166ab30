#!/usr/bin/env bash
# Issue 23's decode inside CUDA graphs on the device machine, one call: veloxquant.torch's GPU tests of
# the sized cache, the device store's fixed descriptor slot (and its memcheck), the device-store
# tests, then the bench on Qwen2.5-1.5B's shape (random weights) at 4K and 32K, batch 1: HF's
# compiled static cache, ours compiled with the cudagraph-unsafe op (+c) and sized up front (+cg);
# diag: bench/cuda/diag_sized.py (eager / compiled / graphed runs of sized and unsized coded caches).
# Binaries built on the project machine and carried: $P (xz test binaries + lib/), $TX (the torch
# bridge, xz). Stages (default tests,store,bench): tests, store, bench, diag.
#   bash bench/cuda/run_issue23_graphs.sh [stages]
set -uo pipefail
export VQ_PREBUILT=${VQ_PREBUILT:-.gpubin-d} PYTHONUNBUFFERED=1
L=${OUT:-out/issue23}
mkdir -p "$L" .gpubin-t
stages=${1:-tests,store,bench}
has() { [[ ",$stages," == *",$1,"* ]]; }
xz -dc "${VQ_TORCH_PACKED:-.gpubin-tx}/libveloxquant_torch.so.xz" > .gpubin-t/libveloxquant_torch.so
if has tests; then
  timeout 150 bash bench/cuda/run_torch_tests.sh -k "sized or compiled or fp16_matches" 2>&1 | tail -12
fi
if has store; then
  P=$VQ_PREBUILT; . bench/cuda/device_prelude.sh > /dev/null
  timeout 60 $BIN/test_kvcache --gtest_filter='*DeviceStore*' --gtest_brief=1 2>&1 | tail -4
  timeout 90 compute-sanitizer --tool memcheck $BIN/test_kvcache --gtest_filter='DeviceStore.FixedSlot*' \
    --gtest_brief=1 2>&1 | grep -E "ERROR SUMMARY|PASSED|FAILED" | tail -2
fi
if has diag; then
  root=$(mktemp -d); mkdir -p "$root/veloxquant"; cp python/veloxquant/torch.py "$root/veloxquant/"
  : > "$root/veloxquant/__init__.py"
  PYTHONPATH=$root VQ_TORCH_LIB=$PWD/.gpubin-t/libveloxquant_torch.so LD_LIBRARY_PATH=$VQ_PREBUILT/lib:${LD_LIBRARY_PATH:-} \
    timeout 200 python3 -W ignore bench/cuda/diag_sized.py > "$L/diag.txt" 2>&1
  grep -v -i warn "$L/diag.txt" | grep -E "sized=|Error|error" | head -40
fi
if has bench; then
  GEO=${GEO:-qwen2.5-1.5b} CTX=${CTX:-4096,32768} BATCH=${BATCH:-1} LIMIT_S=${LIMIT_S:-280} BUDGET=${BUDGET:-250} STEPS=${STEPS:-32} \
    METHODS=${METHODS:-static+c,vq:vecinfer:d4b8+c,vq:vecinfer:d4b8+cg} OUT=$L bash bench/cuda/run_torch_bench.sh
fi
