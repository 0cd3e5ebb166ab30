#!/usr/bin/env bash
# Parity of the runtime with llama.cpp on the real models (tests/python/test_llamacpp_parity.py):
# tokenization, logits and greedy tokens of Gemma 3 270M and SmolLM2-135M on several prompts.
# For CI: installs llama-cpp-python into build/llamacpp-venv when absent (bench/llamacpp_bench.sh
# --install-only builds llama.cpp from source: 10+ minutes on 2 cores, once), builds the CLI, and
# fails (instead of skipping) when llama.cpp cannot run. Needs scripts/setup.sh first (models).
#   scripts/llamacpp_parity.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
bench/llamacpp_bench.sh --install-only
scripts/build.sh release veloxquant
VQ_LLAMACPP_REQUIRED=1 VQ_BIN=build/release/tools/veloxquant/veloxquant \
  exec .venv/bin/python -m pytest -q -s tests/python/test_llamacpp_parity.py "$@"
