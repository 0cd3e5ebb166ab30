#!/usr/bin/env bash
# The whole test suite: the release build's tests (C++ and Python reference tests), then the
# unit tests again under AddressSanitizer + UndefinedBehaviorSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${VQ_JOBS:-$(nproc)}
scripts/build.sh release
ctest --test-dir build/release --output-on-failure -j "$jobs"
scripts/build.sh asan
ctest --test-dir build/asan --output-on-failure -j "$jobs" -LE slow -E '^py_'
