#!/usr/bin/env bash
# Issue 21 on the H200 (one device call): prefill of a long prompt, ours beside HF transformers, and
# where our time goes. Binaries built on the project machine (nvcc, sm_90 + PTX), xz-packed in $P
# with lib/ (device_prelude.sh).
#   bash run_issue21.sh [stages]   stages: wgtests, pattn, prefill, scale, itl, nsys, hf
#   model:   test_model's device tests (the forward on the GPU, CUDA graphs of decode and mixed steps)
#   wgtests: the device store's parity tests (the prefill kernel's every shape class) with each
#            form of the prefill kernel (warp-specialised, wgmma, mma.sync) and tile size, and the sanitizers
#   pattn:   the prefill chunk alone (512 rows after 32K past tokens) on every sweep geometry,
#            each kernel form x tile size x keys per pass (PATTN_CONFIGS)
#   prefill: veloxquant bench e2e --device cuda --prefill N (random fp16 weights of the geometry),
#            fp16 and vecinfer:d4b8 caches, chunks of PREFILL_CHUNK (default 2048) tokens
#   nsys:    the same prefill under nsys, kernel time summary (cuda_gpu_kern_sum), top kernels
#   itlncu:  ncu kernel durations of one idle decode step and one mixed step (8 streams + a chunk of
#            ITL_CHUNKS rows of an ITL_PROMPT prompt; VQ_PROFILE_STEP=itl-idle|itl-mixed), summed per
#            kernel, beside the wall time of the same steps without the profiler
#   ncu:     Nsight Compute on the prefill chunk alone (NCU_GEO, NCU_KV, NCU_KERNEL regex): the full
#            section set as text and the per-instruction SASS table (stall samples) as CSV
#   hf:      bench/cuda/hf_peer.py on the same geometry (HF_GEO), prefill tok/s of one generate(1)
#            (HF_PROFILE=1: also its top CUDA kernels and one SDPA call per backend at the prompt's shape)
set -uo pipefail
P=${VQ_PREBUILT:-.gpubin-d}
L=${OUT:-out/issue21}
S=$(dirname "$0")
mkdir -p "$L"
stages=${1:-prefill,hf}
GEOS=${GEOS:-qwen2.5-1.5b llama-3.1-8b}
N=${PREFILL_N:-32768}
CH=${PREFILL_CHUNK:-2048}
. "$S/device_prelude.sh"
if has wgtests; then  # WGTEST_CONFIGS: wgmma:warps:ws triples
  for c in ${WGTEST_CONFIGS:-1:8:1 1:8:0 1:4:0 0:4:0 0:8:0}; do
    IFS=: read wg w ws <<< "$c"
    VQ_PREFILL_WGMMA=$wg VQ_PREFILL_WARPS=$w VQ_PREFILL_WS=$ws timeout 200 $BIN/test_kvcache --gtest_filter='*DeviceStore*' \
      --gtest_brief=1 > $L/wgtests_$wg$w$ws.log 2>&1
    summary "test_kvcache wgmma=$wg warps=$w ws=$ws" $? $L/wgtests_$wg$w$ws.log
  done
  timeout 150 $BIN/test_ops --gtest_filter='*Cuda*:*cuda*' --gtest_brief=1 > $L/test_ops.log 2>&1; summary test_ops $? $L/test_ops.log
  sanitizers
fi
if has model; then  # the forward's GPU tests (graph replay of decode and mixed steps among them)
  timeout 200 $BIN/test_model --gtest_filter='*Device*' --gtest_brief=1 > $L/test_model.log 2>&1; summary test_model $? $L/test_model.log
fi
if has pattn; then  # PATTN_CONFIGS: wgmma:warps:keys:ws (keys empty = the dispatcher's choice; ws 0|1)
  for c in ${PATTN_CONFIGS:-1:8::1 1:8::0}; do
    IFS=: read wg w k ws <<< "$c"
    VQ_PREFILL_WGMMA=$wg VQ_PREFILL_WARPS=$w VQ_PREFILL_KEYS=$k VQ_PREFILL_WS=${ws:-1} timeout 150 $BIN/bench_paged_attention ${PATTN_GEOS:-all} \
      fp16 vecinfer:d4b8 --sweep --S 32768 --prefill 512 --reps 20 2>&1 | sed "s/^paged_prefill /paged_prefill $c /" >> $L/pattn.log
  done
  grep paged_prefill $L/pattn.log | awk '{print $2, $3, $4, $7, $8}' | sort -s -k2,2 | sort -s -k3,3
fi
if has prefill; then
  for g in $GEOS; do
    timeout 200 $BIN/veloxquant bench e2e --device cuda --geometry $g --batch 1 --ctx 4096 --steps 2 \
      --kv-cache fp16 --kv-cache vecinfer:d4b8 --prefill $N --prefill-chunk $CH > $L/prefill_$g.log 2>&1
    echo "prefill $g exit $?"; grep -E 'prefill' $L/prefill_$g.log | grep '^|'
  done
fi
if has nsys; then
  NS=$(command -v nsys || ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
  for kv in fp16 vecinfer:d4b8; do
    g=${GEOS%% *}
    if [ -n "$NS" ]; then
      timeout 240 $NS profile -o $L/ns_${kv##*:} -t cuda --force-overwrite true $BIN/veloxquant bench e2e --device cuda \
        --geometry $g --batch 1 --ctx 4096 --steps 2 --kv-cache $kv --prefill $N --prefill-chunk $CH > $L/nsys_${kv##*:}.log 2>&1
      $NS stats -r cuda_gpu_kern_sum -f csv -o $L/kern_${kv##*:} $L/ns_${kv##*:}.nsys-rep > /dev/null 2>&1
      rm -f $L/ns_${kv##*:}.nsys-rep $L/ns_${kv##*:}.sqlite
      echo "nsys $kv: top kernels (total % , ns, calls, name)"
      python3 - "$L/kern_${kv##*:}_cuda_gpu_kern_sum.csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
for r in rows[:12]:
    print(f"  {float(r['Time (%)']):5.1f}% {int(float(r['Total Time (ns)']))/1e6:9.1f} ms {r['Instances']:>7} {r['Name'][:110]}")
PY
    else
      echo "nsys not found on the device"
    fi
  done
fi
if has ncu; then
  NC=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  g=${NCU_GEO:-llama-3.1-8b}; kv=${NCU_KV:-fp16}; tag=${NCU_TAG:-${kv##*:}}
  timeout 400 $NC --set full --clock-control none -k regex:${NCU_KERNEL:-prefill_ws} --launch-skip 2 -c 1 \
    --import-source no -f -o $L/ncu_$tag $BIN/bench_paged_attention $g $kv --sweep --S 32768 --prefill 512 --reps 3 \
    > $L/ncu_run_$tag.log 2>&1
  echo "ncu $tag exit $?"; tail -3 $L/ncu_run_$tag.log
  $NC -i $L/ncu_$tag.ncu-rep --page details --print-details all > $L/ncu_details_$tag.txt 2>&1
  $NC -i $L/ncu_$tag.ncu-rep --page source --csv --print-source sass > $L/ncu_sass_$tag.csv 2>&1
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Bank Conflicts|Issue Slots Busy|No Eligible|Achieved Occupancy" $L/ncu_details_$tag.txt | head -20
  rm -f $L/ncu_$tag.ncu-rep
fi
if has hf; then
  for g in $GEOS; do
    PYTHONUNBUFFERED=1 HF_GEO=$g HF_MODES=static timeout 240 python3 $S/hf_peer.py $N > $L/hf_$g.log 2>&1
    echo "hf $g exit $?"; grep -E "hf_peer|Error" $L/hf_$g.log | tail -3
  done
fi
if has scale; then  # how prefill time grows with the prompt (linear: weights; quadratic: attention) and the chunk
  g=${GEOS%% *}
  for ch in ${SCALE_CHUNKS:-2048 8192}; do
    timeout 200 $BIN/veloxquant bench e2e --device cuda --geometry $g --batch 1 --ctx 4096 --steps 2 --warmup 1 \
      --kv-cache fp16 --kv-cache vecinfer:d4b8 --prefill 8192,16384,32768 --prefill-chunk $ch > $L/scale_$ch.log 2>&1
    echo "scale chunk $ch exit $?"; grep -E 'prefill' $L/scale_$ch.log | grep '^|'
  done
fi
if has itl; then  # deliverable 4: inter-token latency of 8 running streams while a 32K prompt is prefilled
  g=${GEOS%% *}
  timeout 300 $BIN/veloxquant bench e2e --device cuda --geometry $g --batch 8 --ctx 4096 --steps 64 --warmup 8 \
    --kv-cache fp16 --kv-cache vecinfer:d4b8 --itl ${ITL_PROMPT:-32768} --itl-chunks ${ITL_CHUNKS:-128,512,2048} \
    > $L/itl_$g.log 2>&1
  echo "itl $g exit $?"; grep -E 'itl:' $L/itl_$g.log
fi

if has itlncu; then  # where a mixed step's time goes: ncu's kernel durations of one idle and one mixed step
  g=${GEOS%% *}
  NC=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  timeout 200 $BIN/veloxquant bench e2e --device cuda --geometry $g --batch 8 --ctx 4096 --steps 16 --warmup 4 \
    --kv-cache ${ITL_KV:-fp16} --itl ${ITL_PROMPT:-8192} --itl-chunks ${ITL_CHUNKS:-64} > $L/itlncu_wall.log 2>&1
  echo "itl (no profiler) exit $?"; grep -E 'itl:' $L/itlncu_wall.log
  for which in idle mixed; do
    VQ_PROFILE_STEP=itl-$which timeout 300 $NC --clock-control none --cache-control none --profile-from-start off \
      --metrics gpu__time_duration.sum --csv $BIN/veloxquant bench e2e --device cuda --geometry $g --batch 8 --ctx 4096 \
      --steps 4 --warmup 2 --kv-cache ${ITL_KV:-fp16} --itl ${ITL_PROMPT:-8192} --itl-chunks ${ITL_CHUNKS:-64} \
      > $L/itlncu_$which.csv 2> $L/itlncu_$which.err
    echo "ncu $which step exit $?"
    python3 $S/ncu_times.py $L/itlncu_$which.csv --sum
  done
fi
if has itlnsys; then  # where a mixed step's time goes: the itl run (one cache, one chunk size) under nsys
  g=${GEOS%% *}
  NS=$(command -v nsys || ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
  if [ -n "$NS" ]; then
    timeout 300 $NS profile -o $L/ns_itl -t cuda --force-overwrite true $BIN/veloxquant bench e2e --device cuda \
      --geometry $g --batch 8 --ctx 4096 --steps 16 --warmup 4 --kv-cache ${ITL_KV:-fp16} --itl ${ITL_PROMPT:-32768} \
      --itl-chunks ${ITL_CHUNKS:-128} > $L/itlnsys.log 2>&1
    echo "itlnsys exit $?"; grep -E 'itl:' $L/itlnsys.log
    for r in cuda_gpu_kern_sum cuda_api_sum; do
      $NS stats -r $r -f csv -o $L/itl_$r $L/ns_itl.nsys-rep > /dev/null 2>&1
      python3 - "$L/itl_${r}_$r.csv" "$r" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
tot = sum(float(r['Total Time (ns)']) for r in rows)
print(f"{sys.argv[2]}: total {tot/1e6:.1f} ms, {sum(int(r['Num Calls'] if 'Num Calls' in r else r['Instances']) for r in rows)} calls")
for r in rows[:14]:
    n = r.get('Instances') or r.get('Num Calls')
    print(f"  {float(r['Time (%)']):5.1f}% {float(r['Total Time (ns)'])/1e6:9.1f} ms {n:>7} {float(r.get('Avg (ns)', 0))/1e3:8.1f} us {r['Name'][:100]}")
PY
    done
    rm -f $L/ns_itl.nsys-rep $L/ns_itl.sqlite
  else
    echo "nsys not found on the device"
  fi
fi
