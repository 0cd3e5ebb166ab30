#!/usr/bin/env bash
# Builds a libFuzzer target with clang (ASan + UBSan) and runs it.
#   fuzz/run_fuzz.sh [--target gguf|calibration|session|http] [--seconds N] [--out DIR] [--jobs J] [-- libFuzzer flags]
# Targets: gguf (the GGUF reader, fuzz/fuzz_gguf.cpp), calibration (the calibration-file
# reader, fuzz/fuzz_calibration.cpp), session (the session-file reader, fuzz/fuzz_session.cpp) and
# http (the server's request-head parser, fuzz/fuzz_http.cpp).
# The short runs in the test suite: --seconds 25 (gguf, calibration) or 10 (session, http); the
# labelled long ones (ctest -L fuzz_long, not in scripts/test.sh): 300.
# Longer runs: docs/FUZZING.md. New inputs found are kept in OUT/corpus (gguf) or
# OUT/corpus_calibration (the seed corpora in fuzz/ are only read); a crash leaves OUT/crash-*
# and a non-zero exit.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
target=gguf
secs=25
out="$root/build/fuzz"
jobs=1
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --target) target=$2; shift 2 ;;
    --seconds) secs=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "run_fuzz.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
cxx=${VQ_FUZZ_CXX:-$(command -v clang++ || command -v clang++-14 || true)}
if [ -z "$cxx" ]; then echo "run_fuzz.sh: clang++ not found" >&2; exit 2; fi

case "$target" in
  gguf)
    srcs=("$root/fuzz/fuzz_gguf.cpp" "$root/src/model/gguf.cpp" "$root/src/model/weight_formats.cpp"
          "$root/src/codec/scalar_blocks.cpp" "$root/src/core/mmap_file.cpp")
    libs=(-lfmt)
    corpus=corpus seeds="$root/fuzz/corpus" dict="$root/fuzz/gguf.dict" max_len=8192 ;;
  calibration)
    srcs=("$root/fuzz/fuzz_calibration.cpp" "$root/src/codec/calibration_file.cpp"
          "$root/src/codec/calibration_check.cpp" "$root/src/codec/key_transform.cpp"
          "$root/src/codec/learned_key_map.cpp"
          "$root/src/core/checksum.cpp" "$root/src/core/atomic_file.cpp" "$root/src/core/mmap_file.cpp")
    libs=(-lfmt -lxxhash)
    corpus=corpus_calibration seeds="$root/fuzz/corpus_calibration" dict="$root/fuzz/calibration.dict"
    max_len=16384 ;;
  session)
    srcs=("$root/fuzz/fuzz_session.cpp" "$root/src/kvcache/seq_file_format.cpp" "$root/src/core/sha256.cpp")
    libs=(-lfmt)
    corpus=corpus_session seeds="$root/fuzz/corpus_session" dict="$root/fuzz/session.dict" max_len=8192 ;;
  http)
    srcs=("$root/fuzz/fuzz_http.cpp" "$root/src/server/http.cpp")
    libs=()
    corpus=corpus_http seeds="$root/fuzz/corpus_http" dict="$root/fuzz/http.dict" max_len=4096 ;;
  *) echo "run_fuzz.sh: unknown target $target (gguf, calibration, session, http)" >&2; exit 2 ;;
esac

mkdir -p "$out/$corpus"
out=$(cd "$out" && pwd)
bin="$out/fuzz_$target"
rebuild=0
[ -x "$bin" ] || rebuild=1
if [ $rebuild = 0 ]; then
  for s in "${srcs[@]}" "$root"/src/model/*.h "$root"/src/codec/*.h "$root"/src/core/*.h "$root"/src/kvcache/*.h "$root"/src/server/http.h; do
    if [ "$s" -nt "$bin" ]; then rebuild=1; break; fi
  done
fi
if [ $rebuild = 1 ]; then
  echo "run_fuzz.sh: building $bin with $cxx"
  "$cxx" -std=c++20 -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined \
    -fno-sanitize-recover=undefined -I"$root/src" -I"$root/include" -isystem /usr/include/eigen3 "${srcs[@]}" \
    "${libs[@]}" -o "$bin.tmp"
  mv "$bin.tmp" "$bin"
fi

cd "$out"
# -max_len: the seeds are small; longer inputs only slow the search.
# -rss_limit_mb: a reader must not allocate much more than the input size.
par=()
if [ "$jobs" -gt 1 ]; then par=(-fork="$jobs"); fi
"$bin" "$corpus" "$seeds" -dict="$dict" -max_total_time="$secs" -max_len="$max_len" \
  -rss_limit_mb=1024 -timeout=10 -print_final_stats=1 "${par[@]}" "${extra[@]}"
