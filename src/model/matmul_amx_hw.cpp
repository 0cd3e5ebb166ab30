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
  static void configure(bool q6k) {
    TileConfig c;
    std::memset(&c, 0, sizeof c);
    c.palette = 1;
    auto set = [&](int t, int rows, int colsb) {
      c.rows[t] = uint8_t(rows);
      c.colsb[t] = uint16_t(colsb);
    };
    set(0, 16, 32);
    if (q6k) {
      set(1, 16, 16), set(2, 4, 32), set(3, 16, 32), set(4, 16, 16), set(5, 4, 32);
    } else {
      set(1, 16, 32), set(2, 8, 32);
    }
    _tile_loadconfig(&c);
  }
  static void release() { _tile_release(); }
  // GCC's tile intrinsics paste the tile number into the instruction text: literals only.
  template <int T>
  static void zero() {
    if constexpr (T == 0) _tile_zero(0);
    else if constexpr (T == 3) _tile_zero(3);
    else static_assert(T == 0, "accumulator tiles are 0 and 3");
  }
  template <int T>
  static void load(const void* p, int64_t stride) {
    if constexpr (T == 1) _tile_loadd(1, p, stride);
    else if constexpr (T == 2) _tile_loadd(2, p, stride);
    else if constexpr (T == 4) _tile_loadd(4, p, stride);
    else if constexpr (T == 5) _tile_loadd(5, p, stride);
    else static_assert(T == 1, "operand tiles are 1, 2, 4, 5");
  }
  template <int T>
  static void store(void* p, int64_t stride) {
    if constexpr (T == 0) _tile_stored(0, p, stride);
    else if constexpr (T == 3) _tile_stored(3, p, stride);
    else static_assert(T == 0, "accumulator tiles are 0 and 3");
  }
  template <int C, int A, int B>
  static void dp_su() {
    if constexpr (C == 0 && A == 1 && B == 2) _tile_dpbsud(0, 1, 2);
    else if constexpr (C == 3 && A == 4 && B == 5) _tile_dpbsud(3, 4, 5);
    else static_assert(C == 0, "tile products are 0 += 1.2 and 3 += 4.5");
  }
  template <int C, int A, int B>
  static void dp_ss() {
    if constexpr (C == 0 && A == 1 && B == 2) _tile_dpbssd(0, 1, 2);
    else static_assert(C == 0, "the signed tile product is 0 += 1.2");
  }
};

}  // namespace
#endif

#if defined(__x86_64__) && defined(__AMX_TILE__) && defined(__AMX_INT8__)
#include "model/matmul_amx_kernel.inc"
namespace vq::amx_detail {
void run_hw(const Args& a) { Run<HwTiles>(a); }
}  // namespace vq::amx_detail
#else
namespace vq::amx_detail {
void run_hw(const Args&) {}
}  // namespace vq::amx_detail
#endif
