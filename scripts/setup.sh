#!/usr/bin/env bash
# Installs everything VeloxQuant needs on a fresh Debian 12 machine (idempotent):
# compilers and libraries from Debian, Python test tools into .venv from PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
pkgs=(build-essential cmake ninja-build pkg-config git unzip ca-certificates
      libhwy-dev libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev libfmt-dev
      libxxhash-dev clang libclang-rt-dev python3 python3-venv python3-pip
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
if ! .venv/bin/python -c "import numpy, gguf, tokenizers, pytest" 2>/dev/null; then
  echo "setup: installing Python test dependencies into .venv"
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q -r scripts/requirements-test.txt
fi
echo "setup: done"
