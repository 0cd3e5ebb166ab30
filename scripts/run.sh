#!/usr/bin/env bash
# The main job: build, then generate text from the default model (SmolLM2-135M-Instruct,
# fetched on first use) with the VecInfer compressed KV cache, and print its memory beside fp16's.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh release veloxquant
exec build/release/tools/veloxquant/veloxquant generate --kv-cache vecinfer:d4b8 --chat \
  -p "${VQ_PROMPT:-Write a short paragraph about why the sky is blue.}" -n "${VQ_N:-96}" "$@"
