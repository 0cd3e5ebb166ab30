#!/usr/bin/env bash
# Compiles every CPU source of the library for 64-bit Arm (Debian's g++-aarch64-linux-gnu, syntax
# and semantics only: nothing is linked or run), so the NEON and SVE targets of the Highway kernels
# keep building while the project is developed on x86. Highway, fmt, xxHash, Eigen and the other
# header libraries are the host's (their headers do not depend on the architecture); the C and C++
# runtime headers are the cross compiler's own.
#
#   scripts/check_aarch64.sh [BUILD_DIR]     (BUILD_DIR: for the generated headers, build/release)
#
# Exit 0: every file compiled; 1: a file did not (its errors are printed); 77: no cross compiler
# (ctest reports the test as skipped).
set -uo pipefail
cd "$(dirname "$0")/.."
CXX=${VQ_AARCH64_CXX:-aarch64-linux-gnu-g++}
build=${1:-build/release}
if ! command -v "$CXX" >/dev/null; then
  echo "check_aarch64: $CXX not found (Debian package g++-aarch64-linux-gnu, installed by scripts/setup.sh): skipped"
  exit 77
fi
# Only the header libraries the sources use, so the host's C library headers stay out of the way.
inc=$(mktemp -d)
trap 'rm -rf "$inc"' EXIT
for h in hwy fmt nlohmann CLI msgpack.hpp msgpack zmq.h zmq.hpp hiredis xxhash.h; do
  [ -e "/usr/include/$h" ] && ln -s "/usr/include/$h" "$inc/$h"
done
[ -d /usr/include/eigen3 ] && ln -s /usr/include/eigen3/Eigen "$inc/Eigen"
# The CUDA sources are left out.
if git rev-parse --git-dir >/dev/null 2>&1; then list=$(git ls-files 'src/*.cpp'); else list=$(find src -name '*.cpp' | sort); fi
mapfile -t files < <(printf '%s\n' "$list" | grep -v -E '(_cuda|/cuda/)')
jobs=${VQ_JOBS:-$(nproc)}
log=$(mktemp)
printf '%s\n' "${files[@]}" |
  xargs -P "$jobs" -I{} sh -c '"$0" -fsyntax-only -std=c++20 -Isrc -Iinclude -I"$1/include" -isystem "$2" "{}" >/dev/null 2>"$3.$$" || { echo "== {}"; grep -m8 "error" "$3.$$" || head -20 "$3.$$"; }; rm -f "$3.$$"' \
    "$CXX" "$build" "$inc" "$log" >"$log.out"
if [ -s "$log.out" ]; then
  cat "$log.out"
  echo "check_aarch64: $(grep -c '^== ' "$log.out") of ${#files[@]} files did not compile for aarch64"
  rm -f "$log" "$log.out"
  exit 1
fi
rm -f "$log" "$log.out"
echo "check_aarch64: ${#files[@]} files compiled for aarch64 ($("$CXX" -dumpversion), Highway NEON and SVE targets)"
