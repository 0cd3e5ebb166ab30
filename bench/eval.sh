#!/usr/bin/env bash
# The KV-cache evaluation of one model (docs/BENCHMARKS.md "KV cache evaluation", README figures):
#   1. `veloxquant eval`: quality (ppl, KL, top-1 vs fp16) of every shipped cache on held-out texts
#      at contexts 512 and 2048, and pass-key retrieval up to the model's context limit (or 16k);
#   2. bench/eval_llamacpp.py: llama.cpp's f16 / q8_0 / q4_0 (flash attention) on the same token
#      ids, through llama-cpp-python (installed into build/llamacpp-venv from source, once);
#   3. bench/eval_figures.py: the PNG figures (matplotlib from PyPI into .venv).
# Slow on 2 cores (hours for every method with retrieval up to 8k); --quick runs a small version.
#   bench/eval.sh [--model M] [--out docs/figures] [--bin B] [--no-llamacpp] [--quick] [-- eval args...]
set -euo pipefail
cd "$(dirname "$0")/.."
model=""
out=docs/figures
bin=build/release/tools/veloxquant/veloxquant
llamacpp=1
quick=0
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model=$2; shift ;;
    --out) out=$2; shift ;;
    --bin) bin=$2; shift ;;
    --no-llamacpp) llamacpp=0 ;;
    --quick) quick=1 ;;
    --) shift; break ;;
    *) echo "eval.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[ -x "$bin" ] || scripts/build.sh release veloxquant
mkdir -p "$out" build/eval
# The tag names the outputs: a file's stem up to its first dot (SmolLM2-135M-Instruct.Q4_1.gguf ->
# smollm2-135m-instruct); a known model's name whole, dots made dashes (qwen2.5-coder-1.5b ->
# qwen2-5-coder-1-5b).
m=${model:-$("$bin" info --default-model-path)}
if [ -f "$m" ]; then tag=$(basename "$m" | sed 's/\..*//'); else tag=$m; fi
tag=$(printf '%s' "$tag" | tr 'A-Z' 'a-z' | tr -c 'a-z0-9' '-')
json="$out/eval_$tag.json"
inputs="build/eval/inputs_$tag.json"
extra=()
[ "$quick" = 1 ] && extra=(-c 256 512 --retrieval-ctx 1024 2048 --depths 0 0.5 1 --trials 1)
"$bin" eval ${model:+-m "$model"} -o "$json" --save-inputs "$inputs" "${extra[@]}" "$@"

if [ "$llamacpp" = 1 ]; then
  bench/llamacpp_bench.sh --install-only
  path=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['model']['path'])" "$json")
  build/llamacpp-venv/bin/python bench/eval_llamacpp.py --model "$path" --inputs "$inputs" --merge "$json"
fi

if ! .venv/bin/python -c "import matplotlib" 2>/dev/null; then
  .venv/bin/python -m pip install -q -r bench/requirements-figures.txt
fi
.venv/bin/python bench/eval_figures.py --out "$out" "$json"
