// The AMX prefill kernel on real tiles (matmul_amx.h). Compiled with -mavx512f -mavx512vl -mamx-*
// (src/CMakeLists.txt) and called only where amx_available(): see matmul_amx_kernel.inc.
#include "model/matmul_amx.h"

#if defined(__x86_64__) && defined(__AMX_TILE__) && defined(__AMX_INT8__)
#include <immintrin.h>

#include <cstring>

namespace {

struct alignas(64) TileConfig {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

struct HwTiles {
  static void configure() {
    TileConfig c;
    std::memset(&c, 0, sizeof c);
    c.palette = 1;
    const int shape[3][2] = {{16, 32}, {16, 32}, {8, 32}};  // C, A, B: rows, bytes per row
    for (int t = 0; t < 3; ++t) c.rows[t] = uint8_t(shape[t][0]), c.colsb[t] = uint16_t(shape[t][1]);
    _tile_loadconfig(&c);
  }
  static void release() { _tile_release(); }
  // GCC's tile intrinsics paste the tile number into the instruction text: literals only.
  // GCC's tile intrinsics paste the tile number into the instruction text: literals only.
  template <int T>
  static void zero() {
    static_assert(T == 0, "the accumulator tile is 0");
    _tile_zero(0);
  }
  template <int T>
  static void load(const void* p, int64_t stride) {
    if constexpr (T == 1) _tile_loadd(1, p, stride);
    else if constexpr (T == 2) _tile_loadd(2, p, stride);
    else static_assert(T == 1, "operand tiles are 1 and 2");
  }
  template <int T>
  static void store(void* p, int64_t stride) {
    static_assert(T == 0, "the accumulator tile is 0");
    _tile_stored(0, p, stride);
  }
  template <int C, int A, int B>
  static void dp_ss() {
    static_assert(C == 0 && A == 1 && B == 2, "the tile product is 0 += 1 . 2");
    _tile_dpbssd(0, 1, 2);
  }
};

}  // namespace

#include "model/matmul_amx_kernel.inc"
namespace vq::amx_detail {
void run_hw(const Args& a) { Run<HwTiles>(a); }
}  // namespace vq::amx_detail
#else
namespace vq::amx_detail {
void run_hw(const Args&) {}
}  // namespace vq::amx_detail
#endif
