#!/usr/bin/env bash
# Serving benchmark: veloxquant serve vs llama-cpp-python's server (llama.cpp) on the default
# model, same machine, same run (bench/server_bench.py says what is measured). Uses the llama.cpp
# build of bench/llamacpp_bench.sh (build/llamacpp-venv; the first run builds llama.cpp: 10+
# minutes) and adds llama-cpp-python's [server] extras to it.
#   bench/server_bench.sh [--bin B] [--model M] [--kv SPEC] [--threads T] [--clients C]
#                         [--requests R] [--max-tokens N] [--budget-mib MiB] [--write-doc FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${VQ_LLAMACPP_VENV:-build/llamacpp-venv}
llama_cpp_version=0.3.16
bin=build/release/tools/veloxquant/veloxquant
model=""
args=()
cmdline="bench/server_bench.sh $*"
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift ;;
    --model) model=$2; shift ;;
    --kv|--calib|--threads|--clients|--requests|--max-tokens|--budget-mib|--write-doc) args+=("$1" "$2"); shift ;;
    *) echo "server_bench: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
if ! "$venv/bin/python" -c "import llama_cpp.server, sse_starlette" 2>/dev/null; then
  # The llama.cpp build of bench/llamacpp_bench.sh (one build for every llama.cpp peer), then the
  # server's extras beside it (pure Python: pip does not rebuild the installed binding).
  VQ_LLAMACPP_VENV="$venv" bench/llamacpp_bench.sh --install-only
  echo "server_bench: adding llama-cpp-python[server]==$llama_cpp_version's extras to $venv" >&2
  "$venv/bin/python" -m pip install -q "llama-cpp-python[server]==$llama_cpp_version"
fi
if [ -z "$model" ]; then
  model=$("$bin" info --default-model-path)
  args+=(--default-model)
fi
exec .venv/bin/python bench/server_bench.py --bin "$bin" --model "$model" --llama-python "$venv/bin/python" \
  --command "$cmdline" "${args[@]}"
