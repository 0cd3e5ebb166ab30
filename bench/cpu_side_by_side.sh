#!/usr/bin/env bash
# CPU side by side (issue 22): veloxquant's prefill and decode beside llama.cpp's (llama-cpp-python,
# built from source by bench/llamacpp_bench.sh --install-only) on the same token ids, for
# SmolLM2-135M (Q4_1), Gemma 3 270M (Q4_K_M), Qwen2.5-Coder-0.5B (Q4_K_M) and Qwen2.5-Coder-1.5B
# (Q4_K_M, when present), at contexts 512, 4096 and 16384 (those within each model's trained
# context), 1 and 2 threads; llama.cpp at its fastest KV type / flash-attention setting per row.
# Prints a Markdown table (for docs/BENCHMARKS.md). Not a test; run it on a quiet machine.
# Long: every row prefills its context once per llama.cpp setting and once per KV cache of ours
# (Qwen2.5-Coder-1.5B at 16384 tokens is minutes per prefill on 2 cores); narrow it with
# --contexts, --llama-configs (e.g. f16+fa,q8_0+fa) or --models for a first look.
#   bench/cpu_side_by_side.sh [--bin path/to/veloxquant] [--models "name=path.gguf,..."]
#                             [--threads "1 2"] [--contexts "512 4096 16384"] [--decode 32] [--reps 1]
#                             [--ours-kv fp16,vecinfer:d4b8] [--llama-configs f16,f16+fa,q8_0+fa,q4_0+fa]
#                             [--json out.json] [--calib-dir build/side_by_side_calib]
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${VQ_LLAMACPP_VENV:-build/llamacpp-venv}
bin=build/release/tools/veloxquant/veloxquant
models=""
args=()
cmdline="bench/cpu_side_by_side.sh $*"
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift ;;
    --models) models=$2; shift ;;
    --threads|--contexts|--decode|--reps|--ours-kv|--llama-configs|--json|--calib-dir) args+=("$1" "$2"); shift ;;
    *) echo "cpu_side_by_side: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[ -x "$bin" ] || { echo "cpu_side_by_side: no veloxquant binary at $bin (build it: scripts/build.sh release veloxquant, or --bin)" >&2; exit 2; }
bench/llamacpp_bench.sh --install-only

if [ -z "$models" ]; then
  # The known models in the model cache (core/cache_dir.cpp; `veloxquant info -m NAME` fetches one).
  cache=${VQ_CACHE_DIR:-${XDG_CACHE_HOME:+$XDG_CACHE_HOME/veloxquant}}
  cache=${cache:-$HOME/.cache/veloxquant}/models
  for spec in smollm2-q4_1=SmolLM2-135M-Instruct.Q4_1.gguf gemma3-270m-q4_k_m=gemma-3-270m-q4_k_m.gguf \
              qwen2.5-coder-0.5b-q4_k_m=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \
              qwen2.5-coder-1.5b-q4_k_m=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf; do
    name=${spec%%=*}; file=$cache/${spec#*=}
    if [ -f "$file" ]; then
      models+="${models:+,}$name=$file"
    elif [ "$name" = qwen2.5-coder-1.5b-q4_k_m ]; then
      echo "cpu_side_by_side: $file not present; Qwen2.5-Coder-1.5B left out" >&2
    else
      echo "cpu_side_by_side: $file not found (fetch it: $bin info -m KNOWN-NAME, see src/model/known_models.cpp)" >&2; exit 2
    fi
  done
fi
exec "$venv/bin/python" bench/cpu_side_by_side.py --models "$models" --bin "$bin" --command "$cmdline" "${args[@]}"
