// The AMX prefill kernel on a scalar model of the tile instructions (matmul_amx.h), for tests on
// CPUs without AMX. Compiled with -mavx2 -mfma -mf16c (src/CMakeLists.txt) and called only where
// those are present: see matmul_amx_kernel.inc.
#include "model/matmul_amx.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <cstring>

namespace {

struct EmuTile {
  int rows, colsb;
  alignas(64) uint8_t d[16 * 64];
};
thread_local EmuTile tiles[8];

// Tile shapes as the hardware backend configures them (rows, bytes per row).
struct EmuTiles {
  static void configure() {
    const int shape[3][2] = {{16, 32}, {16, 32}, {8, 32}};  // C, A, B: rows, bytes per row
    for (int t = 0; t < 8; ++t) {
      tiles[t].rows = t < 3 ? shape[t][0] : 0;
      tiles[t].colsb = t < 3 ? shape[t][1] : 0;
    }
  }
  static void release() {}
  template <int T>
  static void zero() {
    std::memset(tiles[T].d, 0, sizeof tiles[T].d);
  }
  template <int T>
  static void load(const void* p, int64_t stride) {
    for (int r = 0; r < tiles[T].rows; ++r)
      std::memcpy(tiles[T].d + 64 * r, static_cast<const uint8_t*>(p) + r * stride, size_t(tiles[T].colsb));
  }
  template <int T>
  static void store(void* p, int64_t stride) {
    for (int r = 0; r < tiles[T].rows; ++r)
      std::memcpy(static_cast<uint8_t*>(p) + r * stride, tiles[T].d + 64 * r, size_t(tiles[T].colsb));
  }
  // C[m][n] += sum over k (A's 4-byte groups) of A[m][4k + i] * B[k][4n + i], i 0..3, in int32.
  template <int C, int A, int B>
  static void dp_ss() {
    EmuTile &c = tiles[C], &a = tiles[A], &b = tiles[B];
    for (int m = 0; m < c.rows; ++m)
      for (int n = 0; n < c.colsb / 4; ++n) {
        int32_t s;
        std::memcpy(&s, c.d + 64 * m + 4 * n, 4);
        for (int k = 0; k < a.colsb / 4; ++k)
          for (int i = 0; i < 4; ++i) s += int32_t(int8_t(a.d[64 * m + 4 * k + i])) * int32_t(int8_t(b.d[64 * k + 4 * n + i]));
        std::memcpy(c.d + 64 * m + 4 * n, &s, 4);
      }
  }
};

}  // namespace

#include "model/matmul_amx_kernel.inc"
namespace vq::amx_detail {
void run_emu(const Args& a) { Run<EmuTiles>(a); }
}  // namespace vq::amx_detail
#else
namespace vq::amx_detail {
void run_emu(const Args&) {}
}  // namespace vq::amx_detail
#endif
