#!/usr/bin/env bash
# Issue 20 on the H200 (one device call): GPU parity tests of the decode kernels, the dense-kernel
# variants on a few shapes of each geometry, the sweep (bench_paged_attention --sweep) and its
# torch peer (torch_peers.py sweep), joined by sweep_table.py. Binaries built on the project
# machine (nvcc, sm_90 + PTX), xz-packed in $P with lib/ (device_prelude.sh); this script and its
# two Python helpers are read from $P/scripts when the checkout that travels lacks them.
#   bash run_issue20.sh [stages]   stages: tests, gputests, sanitize, variants, caps, torch, sweep, table, e2e
# SWEEP_GEOS narrows the sweep to geometries whose name contains it (default all).
set -uo pipefail
P=${VQ_PREBUILT:-.gpubin-decode}
L=${OUT:-out/issue20}
S=$(dirname "$0")
mkdir -p "$L"
stages=${1:-tests,variants}
. "$S/device_prelude.sh"
if has tests; then
  timeout 200 $BIN/test_kvcache --gtest_filter='*DeviceStore*:VecInferGpu.*' --gtest_brief=1 > $L/test_kvcache.log 2>&1
  summary test_kvcache $? $L/test_kvcache.log
  timeout 100 $BIN/test_ops --gtest_filter='*Cuda*Attention*:*Paged*' --gtest_brief=1 > $L/test_ops.log 2>&1
  summary test_ops $? $L/test_ops.log
fi
if has sanitize; then sanitizers; fi  # device_prelude.sh
if has variants; then
  for bs in "1 204800" "4 65536" "64 16384"; do
    set -- $bs
    timeout 100 $BIN/bench_paged_attention all fp16 --sweep --variants ${VARIANTS:-0} --reps 15 --B $1 --S $2 >> $L/variants.log 2>&1
  done
  echo "variants exit $?"
fi
if has torch; then
  PYTHONUNBUFFERED=1 timeout 240 python3 $S/torch_peers.py sweep > $L/torch.log 2>&1; echo "torch exit $?"; tail -2 $L/torch.log
fi
if has sweep; then
  timeout ${SWEEP_TIMEOUT:-240} $BIN/bench_paged_attention ${SWEEP_GEOS:-all} ${SWEEP_CACHES:-fp16 vecinfer:d4b8 vecinfer:d4b8,gran=shared} --sweep --reps 15 --variants ${SWEEP_VARIANTS:--1} > $L/sweep.log 2>&1
  echo "sweep exit $?"; grep -c graph_ms $L/sweep.log
fi
if has table; then
  [ -s $L/variants.log ] && python3 $S/sweep_table.py $L/variants.log $L/torch.log --variants > $L/variants_table.md
  [ -s $L/sweep.log ] && python3 $S/sweep_table.py $L/sweep.log $L/torch.log > $L/sweep_table.md
  cat $L/variants_table.md $L/sweep_table.md 2>/dev/null | grep -E "^worst|^\| (llama|qwen2.5-7b|falcon)" | head -60
fi
if has e2e; then  # deliverable 5: the decode step end to end (random device weights of the geometry)
  for geo in qwen2.5-7b llama-3.1-8b; do
    timeout ${E2E_TIMEOUT:-200} $BIN/veloxquant bench e2e --device cuda --geometry $geo --batch 1,8,32 --ctx 32768,131072 \
      --kv-cache fp16 --kv-cache vecinfer:d4b8 --kv-cache vecinfer:d4b8,gran=shared --steps 16 > $L/e2e_$geo.log 2>&1
    echo "e2e $geo exit $?"; grep -E '^\| (fp16|vec)' $L/e2e_$geo.log
  done
fi
if has gputests; then gpu_tests; fi  # every test binary's GPU tests (device_prelude.sh)
if has caps; then  # the LUT kernel's split cap at few (row, KV head) units (paged_attention_set_coded_split_cap)
  for geo in qwen2.5-1.5b 70b-tp8 qwen2.5-7b; do
    for B in 1 4; do
      timeout 100 $BIN/bench_paged_attention $geo vecinfer:d4b8 --sweep --B $B --reps 15 --coded-caps ${CAPS:-8,16,32,64} \
        >> $L/caps.log 2>&1
    done
  done
  echo "caps exit $?"
  python3 - $L/caps.log <<'PY'
import re, sys, collections
rows = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    if line.startswith("paged_attn"):
        f = dict(re.findall(r"(\w+)=(\S+)", line))
        rows[(f["geo"], int(f["B"]), int(f["S"]))][int(f["coded_cap"])] = float(f["graph_ms"])
caps = sorted({c for r in rows.values() for c in r})
print("| geometry | B | S | " + " | ".join(f"cap {c} ms" for c in caps) + " |")
for k in sorted(rows):
    print(f"| {k[0]} | {k[1]} | {k[2]} | " + " | ".join(f"{rows[k].get(c, float('nan')):.4f}" for c in caps) + " |")
PY
fi

