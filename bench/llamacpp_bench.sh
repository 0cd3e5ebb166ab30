#!/usr/bin/env bash
# Prefill and decode tokens/s of llama.cpp (through llama-cpp-python, built from source) beside
# veloxquant's runtime on the same model and machine, 1 and 2 threads, contexts 512 and 4096.
# Not a test: it installs llama-cpp-python into build/llamacpp-venv (once; the build of llama.cpp
# takes a while) and prints a Markdown table.
#   bench/llamacpp_bench.sh [--install-only] [--model M.gguf] [--bin path/to/veloxquant]
#                           [--threads "1 2"] [--contexts "512 4096"] [--decode N] [--reps R]
#                           [--write-doc docs/BENCHMARKS.md] [--note TEXT]
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${VQ_LLAMACPP_VENV:-build/llamacpp-venv}
llama_cpp_version=0.3.16
model=""
bin=build/runtime/tools/veloxquant/veloxquant
threads="1 2"
contexts="512 4096"
n_decode=64
reps=3
install_only=0
write_doc=""
note=""
cmdline="bench/llamacpp_bench.sh $*"
while [ $# -gt 0 ]; do
  case "$1" in
    --install-only) install_only=1 ;;
    --model) model=$2; shift ;;
    --bin) bin=$2; shift ;;
    --threads) threads=$2; shift ;;
    --contexts) contexts=$2; shift ;;
    --decode) n_decode=$2; shift ;;
    --reps) reps=$2; shift ;;
    --write-doc) write_doc=$2; shift ;;   # append the table to this file's "Model runtime (CPU)" section
    --note) note=$2; shift ;;             # a line written above the table

    *) echo "llamacpp_bench: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

if ! "$venv/bin/python" -c "import llama_cpp" 2>/dev/null; then
  echo "llamacpp_bench: installing llama-cpp-python==$llama_cpp_version into $venv (builds llama.cpp)" >&2
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  # Native CPU build (AVX-512 here), no server/examples: only the library the binding loads.
  CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF" \
  CMAKE_BUILD_PARALLEL_LEVEL=${VQ_JOBS:-2} \
    "$venv/bin/python" -m pip install -q --no-cache-dir "llama-cpp-python==$llama_cpp_version" numpy
fi
[ "$install_only" = 1 ] && exit 0

if [ -z "$model" ]; then
  model=$("$bin" info --default-model-path)
fi
exec "$venv/bin/python" bench/llamacpp_bench.py --model "$model" --bin "$bin" \
  --threads "$threads" --contexts "$contexts" --decode "$n_decode" --reps "$reps" ${VQ_BENCH_KV:+--kv "$VQ_BENCH_KV"} \
  --command "$cmdline" ${write_doc:+--write-doc "$write_doc"} ${note:+--doc-note "$note"}
