#!/usr/bin/env bash
# bench/torch_cache_bench.py on the device machine (torch and transformers there, no package
# registry): libveloxquant_torch.so built on the project machine and carried xz-packed in
# $TX/libveloxquant_torch.so.xz (or unpacked in $T), the Debian libraries it links in $P/lib.
#   CTX=32768 BATCH=1 METHODS=static+c,vq:vecinfer:d4b8+c,vq:vecinfer:d4b8 bash bench/cuda/run_torch_bench.sh
# static+c: HF's StaticCache with the decode step under torch.compile (mode reduce-overhead);
# vq:SPEC+c: veloxquant.torch's cache the same way; without +c, eager. nokv+c: the compiled model
# with no cache (the step's floor). hqq4/hqq2: HF's QuantizedCache (carry the wheels, below).
# A real model that exceeds one call's carry travels in parts (bench/cuda/carried_parts.sh), one call
# each while the machine stays warm:
#   STASH=.gpubin-q/part.00 bash bench/cuda/run_torch_bench.sh     (copies the part to /root/vqmodel)
#   GGUF=/root/vqmodel/model.gguf SHA=.gpubin-q/SHA256 EXTRA="--calib F --kl-text ids.txt" CTX=4096 ...
# joins the parts into GGUF (checked against SHA) and passes --gguf GGUF; EXTRA goes to the bench.
set -uo pipefail
. "$(dirname "$0")/carried_parts.sh"
if [ -n "${STASH:-}" ]; then stash_part "$STASH" /root/vqmodel; exit; fi
if [ -n "${GGUF:-}" ]; then join_parts /root/vqmodel "$GGUF" "${SHA:-}" || exit 3; fi
P=${VQ_PREBUILT:-.gpubin-d}
T=${VQ_TORCH_PREBUILT:-.gpubin-t}
TX=${VQ_TORCH_PACKED:-.gpubin-tx}
O=${OUT:-out/torch_bench}
mkdir -p "$O" "$T"
[ -f "$T/libveloxquant_torch.so" ] || xz -dc "$TX/libveloxquant_torch.so.xz" > "$T/libveloxquant_torch.so"
root=$(mktemp -d)
mkdir -p "$root/veloxquant"
cp python/veloxquant/torch.py "$root/veloxquant/"
: > "$root/veloxquant/__init__.py"
# Wheels carried in $TX/wheels (HF QuantizedCache's HQQ backend and what it imports: pip download
# --no-deps hqq termcolor einops accelerate) are installed beside it, each only where the machine lacks it.
. "$(dirname "$0")/carried_wheels.sh"
install_missing_wheels "$root" "$TX"/wheels/*.whl
export PYTHONPATH=$root VQ_TORCH_LIB=$PWD/$T/libveloxquant_torch.so LD_LIBRARY_PATH=$PWD/$P/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
python3 -c "import torch, transformers, torch._inductor.config as c; print('torch', torch.__version__, 'transformers', transformers.__version__, 'graph_partition', getattr(c, 'graph_partition', None))"
timeout "${LIMIT_S:-540}" python3 bench/torch_cache_bench.py --geometry "${GEO:-llama-3.1-8b}" --ctx "${CTX:-4096,32768}" \
  --batch "${BATCH:-1}" --methods "${METHODS:-static+c,vq:vecinfer:d4b8+c,vq:vecinfer:d4b8}" --steps "${STEPS:-16}" \
  --case-s "${CASE_S:-200}" --budget-s "${BUDGET:-500}" --out "$O/rows.json" ${GGUF:+--gguf "$GGUF"} ${EXTRA:-} 2>&1 | grep -v -i warn | tail -25
