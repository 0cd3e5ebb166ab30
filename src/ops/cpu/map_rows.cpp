// x[i] <- M x[i] with each row's arithmetic independent of the batch (map_rows.h). Tiles of up to
// kRows rows share each row of M (read once per tile, from L1); within a tile every row runs the
// same operations as it would alone: its dot product with row r of M accumulates D / N column
// vectors in ascending order into one vector (FMA), columns past the last whole vector are added
// lane by lane in the same order, then the lanes are summed by SumOfLanes.
#include "ops/cpu/no_sve_targets.h"  // first: before any Highway header
#include "ops/cpu/map_rows.h"

#include <algorithm>
#include <cmath>

#include "core/buffer.h"
#include "core/thread_pool.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/cpu/map_rows.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace vq {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

constexpr int kRows = 4;

// Rows [0, R) of xin (D floats each, contiguous) through M into out[i * stride].
template <int R>
HWY_INLINE void Tile(const float* M, const float* xin, float* out, int D, int64_t stride) {
  const hn::ScalableTag<float> df;
  const int N = int(hn::Lanes(df)), Dv = D / N * N;
  for (int r = 0; r < D; ++r) {
    const float* m = M + int64_t(r) * D;
    hn::Vec<decltype(df)> acc[R];
    for (int i = 0; i < R; ++i) acc[i] = hn::Zero(df);
    for (int c = 0; c < Dv; c += N) {
      const auto w = hn::LoadU(df, m + c);
      for (int i = 0; i < R; ++i) acc[i] = hn::MulAdd(w, hn::LoadU(df, xin + int64_t(i) * D + c), acc[i]);
    }
    for (int i = 0; i < R; ++i) {
      float s = hn::GetLane(hn::SumOfLanes(df, acc[i]));
      for (int c = Dv; c < D; ++c) s = std::fma(m[c], xin[int64_t(i) * D + c], s);
      out[int64_t(i) * stride + r] = s;
    }
  }
}

void MapRows(const float* M, float* x, int64_t n, int D, int64_t stride) {
  thread_local AlignedBuffer<float> in;  // [kRows][D] the tile's input rows (the output overwrites them)
  if (in.size() < size_t(kRows) * size_t(D)) in.resize(size_t(kRows) * size_t(D));
  for (int64_t i0 = 0; i0 < n; i0 += kRows) {
    const int R = int(std::min<int64_t>(kRows, n - i0));
    for (int i = 0; i < R; ++i) std::copy_n(x + (i0 + i) * stride, D, in.data() + int64_t(i) * D);
    float* out = x + i0 * stride;
    switch (R) {
      case 4: Tile<4>(M, in.data(), out, D, stride); break;
      case 3: Tile<3>(M, in.data(), out, D, stride); break;
      case 2: Tile<2>(M, in.data(), out, D, stride); break;
      default: Tile<1>(M, in.data(), out, D, stride); break;
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace vq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace vq::cpu {
HWY_EXPORT(MapRows);

void map_rows(const float* M, float* x, int64_t n, int D, int64_t stride) {
  if (n <= 0 || D <= 0) return;
  // A prefill chunk's rows over the threads (a row's bits do not depend on its neighbours, so
  // neither on the split); a decode step's few rows stay on the calling thread.
  constexpr int64_t kRowsPerThread = 32;
  if (n < 2 * kRowsPerThread) return HWY_DYNAMIC_DISPATCH(MapRows)(M, x, n, D, stride);
  parallel_for(
      size_t(n),
      [&](size_t b, size_t e, int) { HWY_DYNAMIC_DISPATCH(MapRows)(M, x + int64_t(b) * stride, int64_t(e - b), D, stride); },
      size_t(kRowsPerThread));
}

}  // namespace vq::cpu
#endif
