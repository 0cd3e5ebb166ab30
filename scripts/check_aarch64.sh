#!/usr/bin/env bash
# Compiles every CPU source of the library for 64-bit Arm (Debian's g++-aarch64-linux-gnu, syntax
# and semantics only: nothing is linked or run), so the NEON and SVE targets of the Highway kernels
# keep building while the project is developed on x86. Highway, fmt, xxHash, Eigen and the other
# header libraries are the host's (their headers do not depend on the architecture); the C and C++
# runtime headers are the cross compiler's own.
#
#   scripts/check_aarch64.sh [BUILD_DIR] [--all]   (BUILD_DIR: for the generated headers, build/release)
#
# By default only the sources whose code differs by architecture: those that use Highway, an
# architecture macro or intrinsics, directly or through a project header that does (the rest is
# the same C++ on every target, and compiling it again cost the 2-core CI ~2 of its 3 minutes here).
# --all: every CPU source.
#
# Exit 0: every file compiled; 1: a file did not (its errors are printed); 77: no cross compiler
# (ctest reports the test as skipped).
set -uo pipefail
cd "$(dirname "$0")/.."
CXX=${VQ_AARCH64_CXX:-aarch64-linux-gnu-g++}
build=build/release
all=0
for a in "$@"; do
  if [ "$a" = --all ]; then all=1; else build=$a; fi
done
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
if git rev-parse --git-dir >/dev/null 2>&1; then
  list=$(git ls-files 'src/*.cpp'); hlist=$(git ls-files 'src/*.h' 'include/*.h')
else
  list=$(find src -name '*.cpp' | sort); hlist=$(find src include -name '*.h' | sort)
fi
list=$(printf '%s\n' "$list" | grep -v -E '(_cuda|/cuda/)')
if [ "$all" = 0 ]; then
  # Headers with architecture-dependent code, closed over the project headers that include them.
  pat='hwy/|__x86_64__|__aarch64__|__ARM_|immintrin|arm_neon|__AVX|__SSE|HWY_|__i386__'
  mapfile -t hdrs <<<"$hlist"
  arch=$(grep -l -E "$pat" "${hdrs[@]}" | sed 's|.*/||' | sort -u)
  while :; do
    names=$(printf '%s\n' $arch | sed 's/\./\\./g' | paste -sd'|')
    more=$({ printf '%s\n' $arch; grep -l -E "#include \"([^\"]*/)?($names)\"" "${hdrs[@]}" | sed 's|.*/||'; } | sort -u)
    [ "$more" = "$arch" ] && break
    arch=$more
  done  # names: the fixed point's
  list=$(printf '%s\n' "$list" | xargs grep -l -E "$pat|#include \"([^\"]*/)?($names)\"")
fi
mapfile -t files <<<"$list"
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
echo "check_aarch64: ${#files[@]} files compiled for aarch64$([ "$all" = 0 ] && echo ' (the architecture-dependent ones; --all: every one)') ($("$CXX" -dumpversion), Highway NEON and SVE targets)"
