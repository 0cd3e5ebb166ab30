#!/usr/bin/env bash
# Serving benchmark: veloxquant serve vs llama-cpp-python's server (llama.cpp) on the default
# model, same machine, same run (bench/server_bench.py says what is measured). Installs
# llama-cpp-python[server] into build/llamacpp-server-venv once (builds llama.cpp: 10+ minutes).
#   bench/server_bench.sh [--bin B] [--model M] [--kv SPEC] [--threads T] [--clients C]
#                         [--requests R] [--max-tokens N] [--budget-mib MiB] [--write-doc FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${VQ_LLAMACPP_SERVER_VENV:-build/llamacpp-server-venv}
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
  echo "server_bench: installing llama-cpp-python[server]==$llama_cpp_version into $venv (builds llama.cpp)" >&2
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF" \
  CMAKE_BUILD_PARALLEL_LEVEL=${VQ_JOBS:-2} \
    "$venv/bin/python" -m pip install -q --no-cache-dir "llama-cpp-python[server]==$llama_cpp_version"
fi
if [ -z "$model" ]; then
  model=$("$bin" info --default-model-path)
  args+=(--default-model)
fi
exec .venv/bin/python bench/server_bench.py --bin "$bin" --model "$model" --llama-python "$venv/bin/python" \
  --command "$cmdline" "${args[@]}"
