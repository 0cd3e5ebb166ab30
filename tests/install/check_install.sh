#!/usr/bin/env bash
# Installs the build into a temporary prefix and uses it as another project would (never the build
# tree): examples/ configured with find_package(VeloxQuant), the codec example compiled again with
# pkg-config alone, both run; then checks that the installed headers name nothing under src/ and that
# libveloxquant.so exports the public API only.
#   check_install.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

cmake --install "$build" --prefix "$prefix" >/dev/null
libdir=$(dirname "$(find "$prefix" -name 'libveloxquant.so' | head -1)")
test -f "$prefix/include/veloxquant/veloxquant.h"
test -f "$prefix/include/veloxquant/version.h"
test -x "$prefix/bin/veloxquant"
# Public headers include only <std> and "veloxquant/..." headers.
if grep -hE '^#include "' "$prefix"/include/veloxquant/*.h | grep -v '"veloxquant/'; then
  echo "installed headers include non-public headers (above)" >&2
  exit 1
fi

# Every header compiles on its own (includes what it uses).
for h in "$prefix"/include/veloxquant/*.h; do
  echo "#include <veloxquant/$(basename "$h")>" | c++ -std=c++20 -fsyntax-only -I"$prefix/include" -x c++ - ||
    { echo "$h does not compile on its own" >&2; exit 1; }
done

# 1. CMake package. Only the install prefix is given; the build tree is not reachable from there.
cmake -S "$src/examples" -B "$tmp/cmake" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$tmp/cmake" >/dev/null
"$tmp/cmake/vq_codec_example"

# 2. pkg-config (relocatable .pc: the prefix follows the file).
export PKG_CONFIG_PATH=$libdir/pkgconfig
test "$(pkg-config --modversion veloxquant)" = "$(sed -n 's/^#define VELOXQUANT_VERSION "\(.*\)"/\1/p' "$prefix/include/veloxquant/version.h")"
# shellcheck disable=SC2046
c++ -std=c++20 -O1 "$src/examples/codec.cpp" -o "$tmp/codec_pc" $(pkg-config --cflags --libs veloxquant)
LD_LIBRARY_PATH=$libdir "$tmp/codec_pc"

# 3. The generate example on the default model when it is present (scripts/setup.sh fetches it);
#    q8_0 keeps this quick: VecInfer's first-use calibration would add a minute on a cold cache.
model="${VQ_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/veloxquant}/models/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ -f "$model" ]; then
  out=$("$tmp/cmake/vq_generate_example" "Name a colour." q8_0 8)
  echo "$out"
  echo "$out" | grep -cE '^q8_0: [0-9]+ prompt \+ [1-8] generated tokens, KV [0-9]+ bytes vs fp16 [0-9]+ \(8\.50 bits/element, 47% saved\)$' >/dev/null
else
  echo "default model absent: generate example built, not run"
fi

# 4. Exported symbols: the public namespace and the few shared vq types (src/api/veloxquant.map).
leaked=$(nm -D --defined-only -C "$libdir/libveloxquant.so" | awk '{ $1=""; $2=""; print }' | sed -e 's/^ *//' -e 's/@@.*//' |
         grep -vE '^(veloxquant::|vq::(PQPreset|KVCacheConfig)::|vq::(method_name|gpu_kernels_name)\(|(typeinfo|typeinfo name|vtable) for (veloxquant::|vq::(Error|KVCache)$)|VELOXQUANT_0$)' || true)
if [ -n "$leaked" ]; then
  echo "libveloxquant.so exports internal symbols:" >&2
  echo "$leaked" | head -20 >&2
  exit 1
fi
nm -D --defined-only -C "$libdir/libveloxquant.so" | grep -c 'veloxquant::Model::load' >/dev/null  # not -q: SIGPIPE under pipefail
echo "install check: ok"
