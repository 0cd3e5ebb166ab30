#!/usr/bin/env bash
# The whole test suite: the release build's tests (C++, the public API and its install, Python
# package and reference tests), then the unit tests again under AddressSanitizer +
# UndefinedBehaviorSanitizer. VQ_TEST_PIP=1 adds `pip install .` into a fresh venv and the Python
# package's tests against it (scripts/test_pip.sh: one more build of the library, minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${VQ_JOBS:-$(nproc)}
scripts/build.sh release
ctest --test-dir build/release --output-on-failure -j "$jobs" -LE fuzz_long
if [ "${VQ_TEST_PIP:-0}" = 1 ]; then
  CMAKE_BUILD_PARALLEL_LEVEL=$jobs scripts/test_pip.sh
fi
scripts/build.sh asan vq_tests  # the GoogleTest executables only: the CLI is not run under the sanitizers
ctest --test-dir build/asan --output-on-failure -j "$jobs" -LE slow -E '^py_'
