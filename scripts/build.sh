#!/usr/bin/env bash
# Configures and builds one preset (release by default): scripts/build.sh [release|debug|asan] [targets...]
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-release}
shift || true
jobs=${VQ_JOBS:-$(nproc)}
if [ ! -f "build/$preset/build.ninja" ]; then
  cmake --preset "$preset" >/dev/null
fi
cmake --build "build/$preset" -j "$jobs" ${1:+--target "$@"}
